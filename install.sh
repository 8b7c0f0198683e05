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
# Every prerequisite is checked first, in seconds, and a missing one is named in one
# line with the command that installs it: nothing fails after a four-minute build, and
# nothing is left half-made for the next run to trust.
#
# Usage: ./install.sh [--test] [--dry-run] [--fetch-vulkan-headers]
#   --test      add the test extras
#   --dry-run   check the prerequisites and print what would be done; change nothing
#   --fetch-vulkan-headers  for a Vulkan build on Debian 12 (or an Ubuntu as old): fetch
#               Debian 13's Vulkan headers into ~/.cache/localinfer/vulkan-headers with apt-get
#               download and dpkg -x (nothing is installed system-wide); later runs find them
# Environment:
#   LOCALINFER_VENV     where the environment goes (default: .venv beside this file)
#   LOCALINFER_PYTHON   the Python to create it with (default: the newest python3.X >= 3.11 on PATH)
#   LOCALINFER_BACKEND  cpu | cuda | metal | vulkan (default: detected)
#   VULKAN_SDK, Vulkan_INCLUDE_DIR  where Vulkan's SDK or its headers are (a Vulkan build;
#                       default: the system's headers, which must be 1.3.272 or newer)
#   CMAKE_ARGS          your own llama.cpp flags; they replace the detected ones (-DGGML_RPC=ON,
#                       which `localinfer worker` and --rpc need, is added unless they name GGML_RPC)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${LOCALINFER_VENV:-$here/.venv}"
llama_version="$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' "$here/pyproject.toml")"
extras=""
dry_run=0
fetch_headers=0
for arg in "$@"; do
    case "$arg" in
        --test) extras="[test]" ;;
        --dry-run) dry_run=1 ;;
        --fetch-vulkan-headers) fetch_headers=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown option '$arg' (use --test, --dry-run, --fetch-vulkan-headers or --help)" >&2; exit 2 ;;
    esac
done

say() { printf '\033[1m==>\033[0m %s\n' "$*" >&2; }
die() { echo "error: $*" >&2; exit 1; }
os="$(uname -s)"
arch="$(uname -m)"

# --- Python ---------------------------------------------------------------------------
py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }
py_ok() { local v; v="$(py_version "$1")" && [[ "${v%%.*}" -eq 3 && "${v#*.}" -ge 11 ]]; }

how_to_get_python() {
    case "$os" in
        Darwin) echo "install one with 'brew install python@3.12' or from python.org, or set LOCALINFER_PYTHON" ;;
        *) if command -v apt-get >/dev/null; then
               echo "install one with 'sudo apt install python3.11 python3.11-venv' (Ubuntu 22.04: from the deadsnakes PPA), or set LOCALINFER_PYTHON"
           elif command -v dnf >/dev/null; then
               echo "install one with 'sudo dnf install python3.11', or set LOCALINFER_PYTHON"
           elif command -v pacman >/dev/null; then
               echo "install one with 'sudo pacman -S python', or set LOCALINFER_PYTHON"
           else
               echo "install Python 3.11 or newer (python.org, pyenv, uv), or set LOCALINFER_PYTHON"
           fi ;;
    esac
}

find_python() {
    if [[ -n "${LOCALINFER_PYTHON:-}" ]]; then
        py_ok "$LOCALINFER_PYTHON" || die "LOCALINFER_PYTHON=$LOCALINFER_PYTHON is Python $(py_version "$LOCALINFER_PYTHON" || echo '(not runnable)'); localinfer needs 3.11 or newer"
        echo "$LOCALINFER_PYTHON"; return
    fi
    local candidate
    for candidate in python3.14 python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null && py_ok "$candidate"; then command -v "$candidate"; return; fi
    done
    local found="no python3 on PATH"
    command -v python3 >/dev/null && found="python3 is Python $(py_version python3 || echo '(not runnable)')"
    die "localinfer needs Python 3.11 or newer, and $found; $(how_to_get_python)"
}

# A venv that a failed `python -m venv` left behind has bin/python but no pip: never trust it.
venv_ok() { [[ -x "$venv/bin/python" ]] && py_ok "$venv/bin/python" && "$venv/bin/python" -m pip --version >/dev/null 2>&1; }

# --- what to build --------------------------------------------------------------------
detect_backend() {
    if [[ -n "${LOCALINFER_BACKEND:-}" ]]; then echo "$LOCALINFER_BACKEND"; return; fi
    # Metal only on Apple silicon: Intel Macs' GPUs are not worth offloading to.
    if [[ "$os" == "Darwin" ]]; then
        if [[ "$arch" == "arm64" ]]; then echo metal; else echo cpu; fi
        return
    fi
    # A GPU must be present, not only a toolkit: nvcc alone does not make a CUDA machine.
    local nvidia=0 vulkan_gpu=0 summary
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        if command -v nvcc >/dev/null; then echo cuda; return; fi
        nvidia=1
    fi
    # Vulkan for a discrete GPU (AMD, Intel Arc, NVIDIA without CUDA's compiler), never for
    # an integrated one (slower than the CPU engines) or a software one (llvmpipe).
    if command -v vulkaninfo >/dev/null; then
        summary="$(vulkaninfo --summary 2>/dev/null || true)"
        if [[ "$summary" == *PHYSICAL_DEVICE_TYPE_DISCRETE_GPU* ]]; then vulkan_gpu=1; fi
    fi
    if [[ "$vulkan_gpu" == 1 ]] && command -v glslc >/dev/null; then echo vulkan; return; fi
    if [[ "$nvidia" == 1 ]]; then
        say "an NVIDIA GPU is here but not CUDA's compiler nvcc, so llama.cpp is built for the CPU; for the GPU install it ($(packages nvidia-cuda-toolkit cuda-toolkit cuda)) and run install.sh again"
    elif [[ "$vulkan_gpu" == 1 ]]; then
        say "a discrete GPU answers through Vulkan but the shader compiler glslc is missing, so llama.cpp is built for the CPU; for the GPU install it and Vulkan's headers ($(packages 'glslc libvulkan-dev' 'glslc vulkan-headers vulkan-loader-devel' 'shaderc vulkan-headers')) and run install.sh again"
    fi
    echo cpu
}

# What to install, by distribution, for the one-line hints: Debian/Ubuntu, Fedora, Arch.
packages() { echo "Debian/Ubuntu: sudo apt install $1; Fedora: sudo dnf install $2; Arch: sudo pacman -S $3"; }

# --- Vulkan's prerequisites, read before the build ---------------------------------------
# ggml-vulkan.cpp uses vk::LayerSettingEXT (VK_EXT_layer_settings), which Vulkan's headers
# have from 1.3.272; Debian 12 ships 1.3.239, and with it the build failed after minutes of
# shader compiling. The headers are read first: Vulkan_INCLUDE_DIR, else $VULKAN_SDK/include
# (LunarG's SDK), else the system's.
VULKAN_MIN_HEADER=272
fetched_headers="${XDG_CACHE_HOME:-$HOME/.cache}/localinfer/vulkan-headers"
header_version() { sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\).*/\1/p' "$1/vulkan/vulkan_core.h" 2>/dev/null; }

# Where the headers are: the ones named (Vulkan_INCLUDE_DIR, VULKAN_SDK) however old; else the
# system's, unless they are too old and --fetch-vulkan-headers has fetched newer ones.
vulkan_include_dir() {
    if [[ -n "${Vulkan_INCLUDE_DIR:-}" ]]; then echo "$Vulkan_INCLUDE_DIR"; return; fi
    if [[ -n "${VULKAN_SDK:-}" ]]; then echo "$VULKAN_SDK/include"; return; fi
    local d system=""
    for d in /usr/include /usr/local/include; do
        if [[ -f "$d/vulkan/vulkan_core.h" ]]; then system="$d"; break; fi
    done
    if [[ -n "$(header_version "$fetched_headers/root/usr/include")" ]] && [[ -z "$system" || "$(header_version "$system")" -lt "$VULKAN_MIN_HEADER" ]]; then
        echo "$fetched_headers/root/usr/include"
    else
        echo "$system"
    fi
}

# Debian 13's libvulkan-dev (1.4.309), by name from Debian's archive through a private apt
# state folder, unpacked beside the wheels; nothing is installed system-wide.
fetch_vulkan_headers() {
    command -v apt-get >/dev/null && command -v dpkg >/dev/null \
        || die "--fetch-vulkan-headers uses apt-get and dpkg (Debian, Ubuntu); elsewhere install a Vulkan SDK and set VULKAN_SDK"
    local tmp="$fetched_headers.tmp" suite="${LOCALINFER_VULKAN_SUITE:-trixie}"
    rm -rf "$tmp" && mkdir -p "$tmp/lists/partial" "$tmp/archives/partial"
    echo "deb http://deb.debian.org/debian $suite main" > "$tmp/sources.list"
    local o=(-q -o "Dir::State=$tmp" -o "Dir::State::Lists=$tmp/lists" -o "Dir::State::status=/dev/null" -o "Dir::Cache=$tmp"
             -o "Dir::Etc::SourceList=$tmp/sources.list" -o "Dir::Etc::SourceParts=/dev/null" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)")
    say "fetching Debian $suite's Vulkan headers (libvulkan-dev) into $fetched_headers; nothing is installed system-wide"
    apt-get "${o[@]}" update > "$tmp/apt.log" 2>&1 || die "apt-get could not read Debian $suite's package list (see $tmp/apt.log)"
    (cd "$tmp" && apt-get "${o[@]}" download libvulkan-dev >> "$tmp/apt.log" 2>&1) || die "apt-get could not download libvulkan-dev from Debian $suite (see $tmp/apt.log)"
    dpkg -x "$tmp"/libvulkan-dev_*.deb "$tmp/root" || die "dpkg could not unpack $(ls "$tmp"/libvulkan-dev_*.deb)"
    [[ -n "$(header_version "$tmp/root/usr/include")" ]] || die "Debian $suite's libvulkan-dev holds no vulkan_core.h"
    rm -rf "$tmp/lists" "$tmp/archives" "$tmp"/*.bin  # Debian's package lists: tens of MB, needed no more
    rm -rf "$fetched_headers" && mv "$tmp" "$fetched_headers"
}

vulkan_loader_found() {
    if [[ -n "${VULKAN_SDK:-}" ]]; then [[ -e "$VULKAN_SDK/lib/libvulkan.so" ]]; return; fi
    ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so ' && return 0
    local d
    for d in /usr/lib /usr/lib64 /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/local/lib; do
        [[ -e "$d/libvulkan.so" ]] && return 0
    done
    return 1
}

# The CMake flags a Vulkan build needs, after every check: a missing piece, or headers too
# old, is one line naming what to install, before anything is built.
vulkan_args() {
    local missing=() inc version
    command -v glslc >/dev/null || missing+=("the shader compiler glslc")
    inc="$(vulkan_include_dir)"
    [[ -n "$inc" && -f "$inc/vulkan/vulkan_core.h" ]] || missing+=("Vulkan's headers${inc:+ (none in $inc)}")
    vulkan_loader_found || missing+=("the Vulkan loader (libvulkan.so)")
    if [[ ${#missing[@]} -gt 0 ]]; then
        local list; list="$(printf '%s, ' "${missing[@]}")"
        die "a Vulkan build needs ${list%, }; $(packages 'glslc libvulkan-dev' 'glslc vulkan-headers vulkan-loader-devel' 'shaderc vulkan-headers vulkan-icd-loader'), or a Vulkan SDK (set VULKAN_SDK)"
    fi
    version="$(header_version "$inc")"
    if [[ -z "$version" || "$version" -lt "$VULKAN_MIN_HEADER" ]]; then
        local newer="install a Vulkan SDK (set VULKAN_SDK) or a newer distribution's headers (set Vulkan_INCLUDE_DIR to their include folder)"
        if command -v apt-get >/dev/null; then newer="run ./install.sh --fetch-vulkan-headers (Debian 13's, into ~/.cache/localinfer; nothing installed system-wide), or $newer"; fi
        die "Vulkan's headers in $inc are version ${version:-unknown}, older than the $VULKAN_MIN_HEADER llama.cpp's Vulkan backend needs; $newer"
    fi
    echo "-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=$inc"
}

# The CPU's feature names, lower-case: /proc/cpuinfo on Linux, sysctl on an Intel Mac.
cpu_features() {
    if [[ "$os" == "Darwin" ]]; then
        sysctl -n machdep.cpu.features machdep.cpu.leaf7_features 2>/dev/null | tr '[:upper:]' '[:lower:]' | sed 's/avx1\.0/avx/g' || true
    elif [[ -r /proc/cpuinfo ]]; then
        grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2
    fi
}

# x86 flags ggml can use, each turned on only if this CPU reports it; AMX always off.
cpu_flags() {
    local flags
    flags=" $(cpu_features | tr '\n' ' ') "
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

cpu_args() { if [[ "$arch" == x86_64 || "$arch" == amd64 ]]; then cpu_flags; else echo "-DGGML_NATIVE=ON"; fi; }

# The compute capabilities of the cards nvidia-smi lists ("8.6" -> 86), so nvcc builds for
# them alone: with GGML_NATIVE off, ggml would otherwise build for a dozen architectures,
# several times as long. Nothing where the driver does not say (an old driver): ggml's list.
cuda_arch_args() {
    local caps
    caps="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d ' .' | grep -E '^[0-9]+$' | sort -u | tr '\n' ';')" || true
    if [[ -n "$caps" ]]; then echo "-DCMAKE_CUDA_ARCHITECTURES=${caps%;}"; fi
}

# NCCL serves only several GPUs (ggml's all-reduce between cards), and ggml links it whenever
# it finds it: on one card a large library loaded for nothing. Off unless two cards or more.
cuda_nccl_args() {
    local n
    n="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" || true
    if [[ "${n:-0}" -lt 2 ]]; then echo "-DGGML_CUDA_NCCL=OFF"; fi
}

# macOS has shasum, not sha256sum; either will do, and Python is the last resort.
sha256_of_stdin() {
    if command -v sha256sum >/dev/null; then sha256sum | cut -d' ' -f1
    elif command -v shasum >/dev/null; then shasum -a 256 | cut -d' ' -f1
    else "$1" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
    fi
}

how_to_get_compilers() {
    case "$os" in
        Darwin) echo "install Xcode's command-line tools with 'xcode-select --install'" ;;
        *) if command -v apt-get >/dev/null; then echo "install them with 'sudo apt install build-essential cmake' (Debian, Ubuntu)"
           elif command -v dnf >/dev/null; then echo "install them with 'sudo dnf install gcc gcc-c++ cmake' (Fedora)"
           elif command -v pacman >/dev/null; then echo "install them with 'sudo pacman -S base-devel cmake' (Arch)"
           else echo "install gcc and g++ (or clang) and cmake with your package manager"
           fi ;;
    esac
}

# --- checks: all of them before anything is made ---------------------------------------
if [[ "$fetch_headers" == 1 ]]; then
    if [[ "$dry_run" == 1 ]]; then say "would fetch Debian's Vulkan headers into $fetched_headers (--fetch-vulkan-headers)"; else fetch_vulkan_headers; fi
fi
backend="$(detect_backend)"
if [[ -z "${CMAKE_ARGS:-}" ]]; then
    case "$backend" in
        cpu)    CMAKE_ARGS="$(cpu_args)"
                if [[ "$os" == "Darwin" ]]; then CMAKE_ARGS="-DGGML_METAL=OFF $CMAKE_ARGS"; fi ;;
        cuda)   CMAKE_ARGS="-DGGML_CUDA=on $(cuda_arch_args) $(cuda_nccl_args) $(cpu_args)" ;;
        metal)  CMAKE_ARGS="-DGGML_METAL=on" ;;
        vulkan) vulkan="$(vulkan_args)" || exit 1  # its one-line error is said already
                CMAKE_ARGS="$vulkan $(cpu_args)" ;;
        *) echo "error: LOCALINFER_BACKEND must be cpu, cuda, metal or vulkan, not '$backend'" >&2; exit 2 ;;
    esac
fi
# ggml's RPC backend: `localinfer worker` serves this machine's memory from it and `--rpc`
# reaches other machines' workers through it, so every build has it unless told otherwise.
if [[ "$CMAKE_ARGS" != *GGML_RPC* ]]; then CMAKE_ARGS="$CMAKE_ARGS -DGGML_RPC=ON"; fi
export CMAKE_ARGS

recreate=""
venv_ready=0
if venv_ok; then
    venv_ready=1
elif [[ -f "$venv/pyvenv.cfg" || -e "$venv/bin/python" ]]; then
    recreate="it is incomplete (a failed earlier install, or a Python without pip)"
elif [[ -e "$venv" ]]; then
    die "$venv exists and is not a virtual environment; move it away or set LOCALINFER_VENV"
fi
if [[ "$venv_ready" == 1 ]]; then
    py="$venv/bin/python"
else
    base_python="$(find_python)"
    "$base_python" -c "import venv, ensurepip" 2>/dev/null || {
        v="$(py_version "$base_python")"
        hint="install Python's venv module"
        if command -v apt-get >/dev/null; then hint="install it with 'sudo apt install python$v-venv'"; fi
        die "$base_python (Python $v) cannot make virtual environments: its venv/ensurepip module is missing; $hint"
    }
    py="$base_python"
fi

key="$(printf '%s %s' "$llama_version" "$CMAKE_ARGS" | sha256_of_stdin "$py" | cut -c1-12)"
wheels="${XDG_CACHE_HOME:-$HOME/.cache}/localinfer/wheels/$key"
llama="build"
if [[ "$venv_ready" == 1 ]] && "$venv/bin/python" -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$llama_version')" 2>/dev/null \
   && [[ "$(cat "$venv/.llama-build" 2>/dev/null)" == "$key" ]]; then
    llama="installed"
elif ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    llama="cached"
fi
if [[ "$llama" == build ]]; then
    cc_found=""; cxx_found=""
    for c in cc gcc clang; do command -v "$c" >/dev/null && { cc_found="$c"; break; }; done
    for c in c++ g++ clang++; do command -v "$c" >/dev/null && { cxx_found="$c"; break; }; done
    if [[ -z "$cc_found" || -z "$cxx_found" ]]; then
        missing=""
        if [[ -z "$cc_found" ]]; then missing="a C compiler"; fi
        if [[ -z "$cxx_found" ]]; then missing="${missing:+$missing and }a C++ compiler"; fi
        die "building llama.cpp needs $missing, and none is on PATH; $(how_to_get_compilers)"
    fi
    command -v cmake >/dev/null || say "no cmake on PATH: pip will fetch CMake from PyPI for the build ($(how_to_get_compilers | sed 's/install them/or install it/'))"
fi

if [[ "$dry_run" == 1 ]]; then
    echo "python: $py (Python $(py_version "$py"))"
    echo "environment: $venv ($(if [[ "$venv_ready" == 1 ]]; then echo "ready"; elif [[ -n "$recreate" ]]; then echo "would recreate it: $recreate"; else echo "would create it"; fi))"
    echo "backend: $backend"
    echo "CMAKE_ARGS: $CMAKE_ARGS"
    echo "llama-cpp-python $llama_version: $(case "$llama" in installed) echo "installed";; cached) echo "from the cached wheel in $wheels";; build) echo "would build it (a few minutes) and cache it in $wheels";; esac)"
    exit 0
fi

# --- act -------------------------------------------------------------------------------
if [[ -n "$recreate" ]]; then
    say "recreating $venv: $recreate"
    rm -rf "$venv"
fi
if [[ ! -e "$venv" ]]; then
    say "creating $venv with Python $(py_version "$py")"
    "$py" -m venv "$venv" || { rm -rf "$venv"; die "could not create $venv (see above)"; }
fi
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip

if [[ "$llama" != installed ]]; then
    if [[ "$llama" == build ]]; then
        say "building llama-cpp-python $llama_version for '$backend' (a few minutes)"
        say "CMAKE_ARGS=$CMAKE_ARGS"
        rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
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
