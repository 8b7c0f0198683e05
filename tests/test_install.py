"""install.sh's decisions and prerequisite checks, in faked environments: a PATH of our
own with fake `uname`, `nvidia-smi`, `nvcc`, `sysctl`, Pythons that are too old or lack
ensurepip, and no compiler. `--dry-run` prints the plan; nothing is built.

A missing prerequisite must give one `error:` line that says what to install, within
seconds (the timeout below only stops a hang), and leave nothing behind."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)  # not the venv's: a plain Python, as on a fresh machine
UTILS = ["bash", "sed", "cat", "grep", "cut", "tr", "sort", "mkdir", "rm", "mv", "ls", "dirname", "head", "sha256sum"]
COMPILERS = ["cc", "gcc", "c++", "g++", "cmake"]


class FakeMachine:
    """A bin folder that is the whole PATH: symlinks to the real basic tools, plus fakes."""

    def __init__(self, tmp: Path, system: str = "Linux", machine: str = "x86_64", compilers: bool = True) -> None:
        self.tmp = tmp
        self.bin = tmp / "bin"
        self.bin.mkdir(parents=True)
        for tool in UTILS + (COMPILERS if compilers else []):
            real = shutil.which(tool)
            if real:
                (self.bin / tool).symlink_to(real)
        self.script("uname", f'case "$1" in -s) echo {system};; -m) echo {machine};; *) echo {system};; esac')
        self.script("python3", f'exec "{BASE_PYTHON}" "$@"')
        self.script("apt-get", "exit 0")  # a Debian-like machine: hints name apt packages

    def script(self, name: str, body: str) -> Path:
        path = self.bin / name
        path.unlink(missing_ok=True)
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path

    def remove(self, *names: str) -> None:
        for name in names:
            (self.bin / name).unlink(missing_ok=True)

    def install(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        full_env = {
            "PATH": str(self.bin), "HOME": str(self.tmp / "home"), "XDG_CACHE_HOME": str(self.tmp / "cache"),
            "LOCALINFER_VENV": str(self.tmp / "venv"), **(env or {}),
        }  # fmt: skip
        return subprocess.run([str(self.bin / "bash"), str(ROOT / "install.sh"), *args], capture_output=True, text=True, env=full_env, timeout=60)


def plan(r: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert r.returncode == 0, r.stderr
    return dict(line.split(": ", 1) for line in r.stdout.splitlines())


def one_error_line(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture()
def machine(tmp_path: Path) -> FakeMachine:
    return FakeMachine(tmp_path)


def test_linux_cpu_plan(machine: FakeMachine) -> None:
    p = plan(machine.install("--dry-run"))
    assert p["backend"] == "cpu"
    assert "-DGGML_NATIVE=OFF" in p["CMAKE_ARGS"] and "-DGGML_AMX_INT8=OFF" in p["CMAKE_ARGS"]
    assert "would create it" in p["environment"] and "would build" in p["llama-cpp-python 0.3.36"]
    assert not (machine.tmp / "venv").exists()  # a dry run makes nothing


def test_every_build_has_the_rpc_backend_unless_the_user_says_otherwise(machine: FakeMachine) -> None:
    assert plan(machine.install("--dry-run"))["CMAKE_ARGS"].split()[-1] == "-DGGML_RPC=ON"  # `localinfer worker` and --rpc
    assert plan(machine.install("--dry-run", env={"CMAKE_ARGS": "-DGGML_BLAS=ON"}))["CMAKE_ARGS"] == "-DGGML_BLAS=ON -DGGML_RPC=ON"
    assert plan(machine.install("--dry-run", env={"CMAKE_ARGS": "-DGGML_RPC=OFF"}))["CMAKE_ARGS"] == "-DGGML_RPC=OFF"


def test_cuda_needs_a_working_gpu_and_nvcc(machine: FakeMachine) -> None:
    machine.script("nvcc", "echo 'Cuda compilation tools, release 12.4'")
    assert plan(machine.install("--dry-run"))["backend"] == "cpu"  # nvcc alone is not a CUDA machine
    machine.script("nvidia-smi", "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9")
    assert plan(machine.install("--dry-run"))["backend"] == "cpu"  # a card without its driver
    machine.script("nvidia-smi", 'echo "GPU 0: NVIDIA GeForce RTX 3060 (UUID: GPU-0)"')
    p = plan(machine.install("--dry-run"))
    assert p["backend"] == "cuda" and p["CMAKE_ARGS"].startswith("-DGGML_CUDA=on")
    assert "CMAKE_CUDA_ARCHITECTURES" not in p["CMAKE_ARGS"]  # a driver that does not say: ggml's own list
    machine.remove("nvcc")
    assert plan(machine.install("--dry-run"))["backend"] == "cpu"  # a GPU but no toolkit to build for it


def test_cuda_builds_for_the_cards_it_finds(machine: FakeMachine) -> None:
    """nvcc compiles for the compute capabilities nvidia-smi reports, each once (a dozen
    architectures by default: several times the build time)."""
    machine.script("nvcc", "echo 'Cuda compilation tools, release 13.0'")
    smi = 'case "$*" in *compute_cap*) printf "%s\\n" {caps};; *) for c in {caps}; do echo "GPU 0: NVIDIA (UUID: GPU-$c)"; done;; esac'
    machine.script("nvidia-smi", smi.format(caps="9.0"))
    args = plan(machine.install("--dry-run"))["CMAKE_ARGS"].split()
    assert args[:3] == ["-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90", "-DGGML_CUDA_NCCL=OFF"]  # NCCL serves several cards only
    machine.script("nvidia-smi", smi.format(caps="8.9 8.6 8.6"))  # three cards, two kinds
    args = plan(machine.install("--dry-run"))["CMAKE_ARGS"].split()
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;89" in args and "-DGGML_CUDA_NCCL=OFF" not in args


VULKAN_SUMMARY = """Devices:
========
GPU0:
	apiVersion         = 1.3.280
	deviceType         = {kind}
	deviceName         = {name}
"""


def fake_vulkaninfo(machine: FakeMachine, kind: str, name: str) -> None:
    machine.script("vulkaninfo", "cat <<'EOF'\n" + VULKAN_SUMMARY.format(kind=kind, name=name) + "EOF")


def one_note(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    """A missing prerequisite for the GPU: the CPU build goes ahead, with one line that names
    the package on each distribution."""
    notes = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(notes) == 1, r.stderr
    for needle in ("Debian/Ubuntu: sudo apt install", "Fedora: sudo dnf install", "Arch: sudo pacman -S", *needles):
        assert needle in notes[0], notes[0]


def test_vulkan_for_a_discrete_gpu_only(machine: FakeMachine) -> None:
    fake_vulkaninfo(machine, "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU", "AMD Radeon RX 7800 XT (RADV NAVI32)")
    r = machine.install("--dry-run")
    assert plan(r)["backend"] == "cpu"  # no shader compiler: it cannot build for it
    one_note(r, "glslc", "libvulkan-dev", "vulkan-headers", "shaderc")
    machine.script("glslc", "echo 'shaderc v2023.8'")
    sdk = fake_vulkan_sdk(machine.tmp / "sdk", 309)
    p = plan(machine.install("--dry-run", env={"VULKAN_SDK": str(sdk)}))
    assert p["backend"] == "vulkan" and p["CMAKE_ARGS"].startswith(f"-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR={sdk}/include -DGGML_NATIVE=OFF")
    for kind, name in (("PHYSICAL_DEVICE_TYPE_CPU", "llvmpipe (LLVM 15.0.7, 256 bits)"), ("PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU", "Intel(R) UHD Graphics 620")):
        fake_vulkaninfo(machine, kind, name)  # a software device, or an integrated GPU: the CPU engines are faster
        r = machine.install("--dry-run")
        assert plan(r)["backend"] == "cpu" and r.stderr.strip() == "", r.stderr


def fake_vulkan_sdk(folder: Path, header_version: int, loader: bool = True) -> Path:
    """A Vulkan SDK's layout (LunarG's: include/vulkan, lib/libvulkan.so) with headers of this version."""
    (folder / "include" / "vulkan").mkdir(parents=True)
    (folder / "include" / "vulkan" / "vulkan_core.h").write_text(f"#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 3, VK_HEADER_VERSION)\n#define VK_HEADER_VERSION {header_version}\n")
    (folder / "lib").mkdir()
    if loader:
        (folder / "lib" / "libvulkan.so").write_bytes(b"")
    return folder


def test_a_vulkan_build_reads_its_prerequisites_before_it_builds(machine: FakeMachine) -> None:
    """Asked for (LOCALINFER_BACKEND=vulkan), each missing piece is one line before any build:
    the shader compiler, the loader, and headers older than ggml-vulkan needs (1.3.272: it
    failed after minutes of shaders on Debian 12's 1.3.239). Vulkan_INCLUDE_DIR and VULKAN_SDK
    are honoured, the first before the second."""
    vulkan = {"LOCALINFER_BACKEND": "vulkan"}
    new, old = fake_vulkan_sdk(machine.tmp / "new", 309), fake_vulkan_sdk(machine.tmp / "old", 239)
    one_error_line(machine.install("--dry-run", env={**vulkan, "VULKAN_SDK": str(new)}), "glslc", "Debian/Ubuntu: sudo apt install glslc libvulkan-dev", "Fedora", "Arch")
    machine.script("glslc", "echo 'shaderc v2023.8'")
    one_error_line(machine.install("--dry-run", env={**vulkan, "VULKAN_SDK": str(old)}), f"headers in {old}/include are version 239, older than the 272", "VULKAN_SDK", "Vulkan_INCLUDE_DIR", "./install.sh --fetch-vulkan-headers")
    no_loader = fake_vulkan_sdk(machine.tmp / "no-loader", 309, loader=False)
    one_error_line(machine.install("--dry-run", env={**vulkan, "VULKAN_SDK": str(no_loader)}), "the Vulkan loader (libvulkan.so)", "Debian/Ubuntu")
    p = plan(machine.install("--dry-run", env={**vulkan, "VULKAN_SDK": str(old), "Vulkan_INCLUDE_DIR": str(new / "include")}))
    assert p["backend"] == "vulkan" and p["CMAKE_ARGS"].startswith(f"-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR={new}/include ")
    assert not (machine.tmp / "venv").exists()


def test_fetch_vulkan_headers_unpacks_debians_newer_ones_privately_and_later_runs_use_them(machine: FakeMachine) -> None:
    """--fetch-vulkan-headers: apt-get (update, download) in a state folder of its own and dpkg -x
    into the cache, never a system-wide install (faked: the real ones reach Debian's archive). A
    failure is one line (after the one saying what it fetches) and leaves no headers; the fetched headers then serve a Vulkan build
    wherever the system's are older than 1.3.272 or absent."""
    (machine.bin / "id").symlink_to(shutil.which("id"))
    machine.script("glslc", "echo 'shaderc v2023.8'")
    machine.script("apt-get", 'case " $* " in *" update "*) exit 1;; esac; exit 0')
    machine.script("dpkg", 'mkdir -p "$3/usr/include/vulkan" && echo "#define VK_HEADER_VERSION 309" > "$3/usr/include/vulkan/vulkan_core.h"')
    fetched = machine.tmp / "cache" / "localinfer" / "vulkan-headers"
    gone = {"LOCALINFER_PYTHON": str(machine.tmp / "no-python")}  # the install stops right after the fetch: nothing is built here
    r = machine.install("--fetch-vulkan-headers", env=gone)
    said = r.stderr.strip().splitlines()
    assert r.returncode == 1 and said[-1].startswith("error: apt-get could not read Debian trixie's package list (see ") and len(said) == 2, r.stderr
    assert not fetched.exists()  # only its .tmp, with apt's log: never taken for fetched headers
    machine.script("apt-get", 'case " $* " in *" update "*) exit 0;; *" download libvulkan-dev "*) : > libvulkan-dev_1.4.309.0-1_amd64.deb;; esac; exit 0')
    r = machine.install("--fetch-vulkan-headers", env=gone)
    assert r.returncode == 1 and "Debian trixie's Vulkan headers" in r.stderr and "no-python" in r.stderr, r.stderr
    assert (fetched / "root" / "usr" / "include" / "vulkan" / "vulkan_core.h").exists() and not (fetched / "lists").exists()
    system = next((d for d in ("/usr/include", "/usr/local/include") if Path(d, "vulkan", "vulkan_core.h").exists()), None)
    version = int(re.search(r"#define VK_HEADER_VERSION (\d+)", Path(system, "vulkan", "vulkan_core.h").read_text()).group(1)) if system else 0  # type: ignore[union-attr]
    sdk = fake_vulkan_sdk(machine.tmp / "sdk", 309)  # its loader only: the headers are the ones under test
    p = plan(machine.install("--dry-run", env={"LOCALINFER_BACKEND": "vulkan", "Vulkan_INCLUDE_DIR": "", "VULKAN_SDK": ""} | ({} if shutil.which("ldconfig") else {"VULKAN_SDK": str(sdk)})))
    expected = system if version >= 272 else f"{fetched}/root/usr/include"
    assert f"-DVulkan_INCLUDE_DIR={expected} " in p["CMAKE_ARGS"], p


def test_nvidia_gpu_without_nvcc_names_the_toolkit(machine: FakeMachine) -> None:
    machine.script("nvidia-smi", 'echo "GPU 0: NVIDIA GeForce RTX 3060 (UUID: GPU-0)"')
    r = machine.install("--dry-run")
    assert plan(r)["backend"] == "cpu"
    one_note(r, "nvcc", "nvidia-cuda-toolkit", "cuda-toolkit")
    assert machine.install("--dry-run").stderr == r.stderr  # the same each time; nothing else said
    machine.remove("nvidia-smi")
    r = machine.install("--dry-run")
    assert plan(r)["backend"] == "cpu" and r.stderr.strip() == ""  # nothing to offload to: nothing to say


def test_apple_silicon_gets_metal(tmp_path: Path) -> None:
    mac = FakeMachine(tmp_path, "Darwin", "arm64")
    mac.remove("sha256sum")  # macOS has shasum, not sha256sum
    p = plan(mac.install("--dry-run"))
    assert p["backend"] == "metal" and p["CMAKE_ARGS"] == "-DGGML_METAL=on -DGGML_RPC=ON"


def test_intel_mac_gets_no_metal(tmp_path: Path) -> None:
    mac = FakeMachine(tmp_path, "Darwin", "x86_64")
    mac.remove("sha256sum")
    mac.script("shasum", f'exec "{BASE_PYTHON}" -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest(), \' -\')"')
    mac.script("sysctl", "echo 'FPU VME AVX1.0 FMA F16C'; echo 'AVX2 BMI2'")
    p = plan(mac.install("--dry-run"))
    assert p["backend"] == "cpu"
    args = p["CMAKE_ARGS"].split()
    assert "-DGGML_METAL=OFF" in args and "-DGGML_AVX=ON" in args and "-DGGML_AVX2=ON" in args and "-DGGML_AVX512=OFF" in args
    mac.remove("shasum")  # neither tool: Python computes the cache key, the same key
    assert plan(mac.install("--dry-run"))["CMAKE_ARGS"] == p["CMAKE_ARGS"]


def test_no_compiler_fails_at_once_and_names_the_packages(tmp_path: Path) -> None:
    bare = FakeMachine(tmp_path, compilers=False)
    one_error_line(bare.install(), "a C compiler and a C++ compiler", "sudo apt install build-essential cmake")
    assert not (tmp_path / "venv").exists() and not (tmp_path / "cache").exists()
    bare.remove("apt-get")
    bare.script("dnf", "exit 0")
    one_error_line(bare.install(), "sudo dnf install gcc gcc-c++ cmake")
    bare.remove("dnf")
    bare.script("pacman", "exit 0")
    one_error_line(bare.install(), "sudo pacman -S base-devel cmake")


def test_no_compiler_is_fine_with_a_cached_wheel(tmp_path: Path) -> None:
    bare = FakeMachine(tmp_path, compilers=False)
    args = plan(FakeMachine(tmp_path / "other").install("--dry-run"))["CMAKE_ARGS"]
    key = hashlib.sha256(f"0.3.36 {args}".encode()).hexdigest()[:12]
    cached = tmp_path / "cache" / "localinfer" / "wheels" / key
    cached.mkdir(parents=True)
    (cached / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    assert "from the cached wheel" in plan(bare.install("--dry-run"))["llama-cpp-python 0.3.36"]


def test_macos_without_compilers_names_xcode(tmp_path: Path) -> None:
    mac = FakeMachine(tmp_path, "Darwin", "arm64", compilers=False)
    mac.remove("apt-get")
    one_error_line(mac.install(), "xcode-select --install")


def test_old_python_is_named_with_a_way_to_a_new_one(machine: FakeMachine) -> None:
    machine.script("python3", 'case "$*" in *version_info*) echo 3.9;; *) exit 1;; esac')
    one_error_line(machine.install(), "needs Python 3.11 or newer", "python3 is Python 3.9", "sudo apt install python3.11 python3.11-venv")
    machine.remove("apt-get")
    machine.script("pacman", "exit 0")
    one_error_line(machine.install(), "sudo pacman -S python")
    machine.script("python3.12", f'exec "{BASE_PYTHON}" "$@"')  # a newer one beside it is found
    assert plan(machine.install("--dry-run"))["python"].endswith("python3.12 (Python %d.%d)" % sys.version_info[:2])
    one_error_line(machine.install(env={"LOCALINFER_PYTHON": str(machine.bin / "python3")}), "LOCALINFER_PYTHON", "is Python 3.9")


def test_python_without_ensurepip(machine: FakeMachine) -> None:
    """Debian's python3 without python3-venv: `import ensurepip` fails."""
    shadow = machine.tmp / "no-ensurepip" / "ensurepip"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'ensurepip'\")\n")
    machine.script("python3", f'PYTHONPATH="{shadow.parent}" exec "{BASE_PYTHON}" "$@"')
    version = "%d.%d" % sys.version_info[:2]
    one_error_line(machine.install(), "venv/ensurepip module is missing", f"sudo apt install python{version}-venv")
    assert not (machine.tmp / "venv").exists()


def test_half_made_environment_is_recreated_not_trusted(machine: FakeMachine) -> None:
    venv = machine.tmp / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)  # what a failed `python -m venv` leaves
    assert (venv / "bin" / "python").exists()
    p = plan(machine.install("--dry-run"))
    assert "would recreate it: it is incomplete" in p["environment"]
    assert p["python"].startswith(str(machine.bin / "python3"))  # the base Python, not the broken environment's


def test_a_failed_venv_is_removed(machine: FakeMachine) -> None:
    """If `python -m venv` itself fails halfway, the half-made folder goes with it."""
    machine.script("python3", f"""if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin" && ln -s "{BASE_PYTHON}" "$3/bin/python"; echo "Error: Command '-Im ensurepip' returned non-zero exit status 1." >&2; exit 1
fi
exec "{BASE_PYTHON}" "$@\"""")
    r = machine.install()
    assert r.returncode == 1 and "could not create" in r.stderr, r.stderr
    assert not (machine.tmp / "venv").exists()


def test_a_folder_that_is_not_a_venv_is_never_deleted(machine: FakeMachine) -> None:
    precious = machine.tmp / "venv"
    precious.mkdir()
    (precious / "thesis.tex").write_text("\\documentclass{article}")
    one_error_line(machine.install(), "is not a virtual environment")
    assert (precious / "thesis.tex").exists()


def test_unknown_option_is_a_usage_error(machine: FakeMachine) -> None:
    r = machine.install("--frobnicate")
    assert r.returncode == 2 and re.match(r"error: unknown option '--frobnicate'", r.stderr)


def test_help(machine: FakeMachine) -> None:
    r = machine.install("--help")
    assert r.returncode == 0 and "--dry-run" in r.stdout and "LOCALINFER_PYTHON" in r.stdout


@pytest.mark.skipif(not os.access("/proc/cpuinfo", os.R_OK), reason="reads this Linux machine's CPU flags")
def test_cpu_flags_follow_proc_cpuinfo(machine: FakeMachine) -> None:
    flags = set(open("/proc/cpuinfo").read().split("flags", 1)[1].split("\n", 1)[0].split(":", 1)[1].split())
    args = plan(machine.install("--dry-run"))["CMAKE_ARGS"].split()
    assert ("-DGGML_AVX2=ON" in args) == ("avx2" in flags)
    assert ("-DGGML_AVX512=ON" in args) == ({"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"} <= flags)
