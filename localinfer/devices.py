"""Which compute devices this llama.cpp build can use, with their free memory, and the CPU's name.

llama-cpp-python does not bind ggml's device registry, so we call it in the shared
library it already loaded. Used by `doctor` and by `--gpu-layers auto`. A leaf below both
memory.py (which plans layers onto these devices) and the backends (the RPC worker serves
one), so neither imports the other's layer for it.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_TYPES = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "accelerator"}


def cpu_name() -> str:
    """The CPU's marketing name (doctor, and every benchmark figure says which CPU it came from)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The /proc/cpuinfo flags that decide which kernels run, in the order they were added.
SIMD_FLAGS = ["sse4_2", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimddp", "i8mm", "sve"]  # fmt: skip


def cpu_simd_flags() -> list[str]:
    """The SIMD_FLAGS that /proc/cpuinfo lists (empty where there is none): benchmarks name
    the CPU class their figures come from."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in SIMD_FLAGS if flag in present]
    except OSError:
        pass
    return []


@dataclass
class Device:
    name: str
    description: str
    kind: str  # CPU, GPU, iGPU, accelerator
    free_bytes: int
    total_bytes: int

    @property
    def unified(self) -> bool:
        """Does this GPU use the system's RAM (an integrated GPU; Apple silicon, whose Metal
        devices ggml names MTL0, MTL1, ... and reports as plain GPUs)? Then layers put on it
        still take RAM."""
        return self.kind == "iGPU" or (self.kind == "GPU" and self.name.startswith("MTL"))


def ggml() -> ctypes.CDLL | None:
    """ggml's library as llama-cpp-python loaded it, with the device registry's signatures."""
    import llama_cpp

    libdir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (libdir / name).exists():
            return _declare(ctypes.CDLL(str(libdir / name)))
    return None


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for fn in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, fn).restype = ctypes.c_char_p
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    lib.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_reg_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_dev_get.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    return lib


NO_RPC = "this llama.cpp build has no RPC backend: run ./install.sh again (it builds llama.cpp with -DGGML_RPC=ON)"


def rpc_function(lib: ctypes.CDLL, name: str) -> int | None:
    """The address of one of ggml's RPC backend functions, from its registry entry; None
    in a build without the backend (NO_RPC says what to do)."""
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    return lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None


def describe(lib: ctypes.CDLL, dev: int) -> Device:
    """One ggml device (a ggml_backend_dev_t) as data, its memory as it reports it now."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return Device(
        name=(lib.ggml_backend_dev_name(dev) or b"").decode(),
        description=(lib.ggml_backend_dev_description(dev) or b"").decode(),
        kind=_TYPES.get(lib.ggml_backend_dev_type(dev), "unknown"),
        free_bytes=free.value,
        total_bytes=total.value,
    )


# ggml's backends that compute elsewhere than on a GPU: the CPU, a BLAS library, Intel's AMX,
# and other machines (RPC). Any other backend compiled in drives a GPU (CUDA, ROCm, Metal,
# Vulkan, SYCL, OpenCL, MUSA, CANN...).
NOT_GPU = frozenset({"CPU", "BLAS", "AMX", "RPC"})


def backends() -> list[str]:
    """The backends compiled into this llama.cpp build, by ggml's registry names (CPU, RPC,
    CUDA, Metal, ...), whether or not a device of theirs is present. llama.cpp's own
    llama_supports_gpu_offload() cannot say this: the RPC backend alone makes it true."""
    lib = ggml()
    if lib is None:
        return []
    return [(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)) or b"").decode() for i in range(lib.ggml_backend_reg_count())]


def gpu_backends(names: list[str]) -> list[str]:
    """Of these backends, those that drive a GPU."""
    return [name for name in names if name not in NOT_GPU]


def list_devices() -> list[Device]:
    lib = ggml()
    if lib is None:
        return []
    return [describe(lib, lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]



# vulkaninfo's device types, in words; ggml's Vulkan backend takes discrete GPUs by itself,
# and an integrated or software one only where GGML_VK_VISIBLE_DEVICES names it.
VULKAN_KINDS = {
    "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU": "discrete GPU",
    "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU": "integrated GPU",
    "PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU": "virtual GPU",
    "PHYSICAL_DEVICE_TYPE_CPU": "software, on the CPU",
}


@dataclass(frozen=True)
class VulkanDevice:
    index: int  # as GGML_VK_VISIBLE_DEVICES counts them
    name: str
    kind: str  # VULKAN_KINDS' words
    driver: str
    named: bool | None = None  # GGML_VK_VISIBLE_DEVICES names it; None: that variable is not set

    @property
    def taken_by_default(self) -> bool:
        """Does ggml's Vulkan backend use it without GGML_VK_VISIBLE_DEVICES? (Discrete GPUs.)"""
        return self.kind == "discrete GPU"

    @property
    def used(self) -> bool:
        """Does a Vulkan build use it here: named, or a discrete GPU where nothing is named."""
        return self.taken_by_default if self.named is None else self.named


def vulkan_devices() -> list[VulkanDevice]:
    """The Vulkan devices `vulkaninfo --summary` lists (none without it, or where it fails):
    what a Vulkan build of llama.cpp could run on, whether or not this build is one."""
    if not shutil.which("vulkaninfo"):
        return []
    try:
        out = subprocess.run(["vulkaninfo", "--summary"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_vulkan_summary(out)


def parse_vulkan_summary(text: str) -> list[VulkanDevice]:
    """The devices of `vulkaninfo --summary`'s "Devices:" section: GPU0:, GPU1:, ... each
    with `deviceType = ...`, `deviceName = ...` and `driverName = ...` lines."""
    devices: list[dict[str, str]] = []
    for line in text.split("Devices:", 1)[-1].splitlines():
        stripped = line.strip()
        if stripped.startswith("GPU") and stripped.endswith(":"):
            devices.append({})
        elif devices and "=" in stripped:
            key, _, value = stripped.partition("=")
            devices[-1][key.strip()] = value.strip()
    visible = os.environ.get("GGML_VK_VISIBLE_DEVICES")
    named = None if visible is None else {int(i) for i in visible.replace(",", " ").split() if i.isdigit()}
    return [
        VulkanDevice(i, d.get("deviceName", "unknown"), VULKAN_KINDS.get(d.get("deviceType", ""), d.get("deviceType", "unknown")), d.get("driverName", ""),
                     None if named is None else i in named)  # fmt: skip
        for i, d in enumerate(devices)
    ]
