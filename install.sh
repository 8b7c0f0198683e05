#!/usr/bin/env bash
# Install localinfer into a virtual environment, building llama.cpp for this machine.
#
# Why a script and not a plain `pip install`: llama-cpp-python ships only a source
# distribution, and its default build (GGML_NATIVE) enables whatever the compiler
# finds, including AMX on recent Xeons, which segfaults in ggml_backend_amx_mul_mat
# on the first decode. We pick the backend and the CPU flags explicitly, and keep
# the built wheel in a cache keyed by those flags (pip's own wheel cache ignores
# CMAKE_ARGS, so it would hand back a wheel built with the wrong ones).
#
# Usage: ./install.sh [--test]        (--test adds the test extras)
# Environment:
#   LOCALINFER_VENV     where the environment goes (default: .venv beside this file)
#   LOCALINFER_BACKEND  cpu | cuda | metal | vulkan (default: detected)
#   CMAKE_ARGS          your own llama.cpp flags; they replace the detected ones
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${LOCALINFER_VENV:-$here/.venv}"
llama_version="$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$here/pyproject.toml")"
extras=""
[[ "${1:-}" == "--test" ]] && extras="[test]"

say() { printf '\033[1m==>\033[0m %s\n' "$*" >&2; }

detect_backend() {
    if [[ -n "${LOCALINFER_BACKEND:-}" ]]; then echo "$LOCALINFER_BACKEND"; return; fi
    if [[ "$(uname -s)" == "Darwin" ]]; then echo metal; return; fi
    # A GPU must be present, not only a toolkit: nvcc alone does not make a CUDA machine.
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null; then
        echo cuda; return
    fi
    echo cpu
}

# x86 flags ggml can use, each turned on only if this CPU reports it; AMX always off.
cpu_flags() {
    local flags=""
    [[ -r /proc/cpuinfo ]] && flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
    local args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    onoff() { if has "${@:2}"; then echo "-D$1=ON"; else echo "-D$1=OFF"; fi; }
    args+=" $(onoff GGML_AVX avx) $(onoff GGML_AVX2 avx2) $(onoff GGML_FMA fma) $(onoff GGML_F16C f16c)"
    args+=" $(onoff GGML_BMI2 bmi2) $(onoff GGML_AVX_VNNI avx_vnni)"
    args+=" $(onoff GGML_AVX512 avx512f avx512cd avx512vl avx512dq avx512bw)"
    args+=" $(onoff GGML_AVX512_VBMI avx512vbmi) $(onoff GGML_AVX512_VNNI avx512_vnni)"
    args+=" $(onoff GGML_AVX512_BF16 avx512_bf16)"
    echo "$args"
}

backend="$(detect_backend)"
if [[ -z "${CMAKE_ARGS:-}" ]]; then
    case "$backend" in
        cpu)    CMAKE_ARGS="$( [[ "$(uname -m)" == x86_64 ]] && cpu_flags || echo -DGGML_NATIVE=ON )" ;;
        cuda)   CMAKE_ARGS="-DGGML_CUDA=on $(cpu_flags)" ;;
        metal)  CMAKE_ARGS="-DGGML_METAL=on" ;;
        vulkan) CMAKE_ARGS="-DGGML_VULKAN=on $(cpu_flags)" ;;
        *) echo "error: LOCALINFER_BACKEND must be cpu, cuda, metal or vulkan, not '$backend'" >&2; exit 2 ;;
    esac
fi
export CMAKE_ARGS

if [[ ! -x "$venv/bin/python" ]]; then
    say "creating $venv"
    python3 -m venv "$venv"
fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip

# Build llama-cpp-python once per (version, flags); reuse it after that.
key="$(printf '%s %s' "$llama_version" "$CMAKE_ARGS" | sha256sum | cut -c1-12)"
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/localinfer/wheels/$key"
if ! "$py" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$llama_version')" 2>/dev/null \
   || [[ "$(cat "$venv/.llama-build" 2>/dev/null)" != "$key" ]]; then
    if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        say "building llama-cpp-python $llama_version for '$backend' (a few minutes)"
        say "CMAKE_ARGS=$CMAKE_ARGS"
        mkdir -p "$wheels.tmp"
        "$py" -m pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python \
            -w "$wheels.tmp" "llama-cpp-python==$llama_version"
        rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
    fi
    "$py" -m pip install -q --force-reinstall --no-deps "$wheels"/llama_cpp_python-*.whl
    echo "$key" > "$venv/.llama-build"
fi

say "installing localinfer$extras"
"$py" -m pip install -q -e "$here$extras"
say "done: $venv/bin/localinfer"
