"""Find the packages, and build the native C kernels (native/c/*.c) into localinfer_native/_ckernels.

The metadata lives in pyproject.toml; this file adds what it cannot declare: the package
list (found, under the names its package-dir gives the folders) and the optional extension.
The library is loaded with ctypes (localinfer_native.c_kernels), not imported, so it does
not use the Python C API. Compiler flags are picked by trying them: -O3, -march=native
where accepted (the sources choose their SIMD paths with #ifdef __AVX2__ and the like),
and OpenMP where it compiles and links. -ffast-math is never used. $LOCALINFER_CFLAGS is
appended for users. If nothing compiles, the install still succeeds and localinfer uses
the Numba kernels.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
import tomllib
from glob import glob
from pathlib import Path

from setuptools import Extension, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent

OMP_TEST = """
#include <omp.h>
int li_probe(void) { int n = 0;
#pragma omp parallel reduction(+:n)
  n += omp_get_num_threads();
  return n; }
"""
PLAIN_TEST = "int li_probe(void) { return 0; }\n"


class BuildNative(build_ext):
    def _works(self, code: str, cflags: list[str], ldflags: list[str]) -> bool:
        """Does `code` compile with cflags and link into a shared library with ldflags?"""
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "probe.c")
            Path(src).write_text(code)
            try:
                objs = self.compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
                self.compiler.link_shared_object(objs, os.path.join(tmp, "probe.so"), extra_postargs=ldflags)
            except Exception:
                return False
        return True

    def _flags(self) -> tuple[list[str], list[str]]:
        if self.compiler.compiler_type == "msvc":
            cflags, ldflags = ["/O2"], []
            if self._works(OMP_TEST, ["/openmp"], []):
                cflags.append("/openmp")
        else:
            cflags, ldflags = ["-O3", "-std=gnu11"], []
            for arch in (["-march=native"], ["-mcpu=native"]):
                if self._works(PLAIN_TEST, arch, []):
                    cflags += arch
                    break
            if self._works(OMP_TEST, ["-fopenmp"], ["-fopenmp"]):
                cflags.append("-fopenmp")
                ldflags.append("-fopenmp")
        extra = shlex.split(os.environ.get("LOCALINFER_CFLAGS", ""))
        return cflags + extra, ldflags + extra

    def build_extensions(self) -> None:
        try:
            cflags, ldflags = self._flags()
        except Exception as e:  # a broken compiler: let the build itself fail (optional)
            print(f"localinfer: probing compiler flags failed ({e})", file=sys.stderr)
            cflags, ldflags = [], []
        print(f"localinfer: building the C kernels with {' '.join(cflags)}", file=sys.stderr)
        for ext in self.extensions:
            ext.extra_compile_args = cflags
            ext.extra_link_args = ldflags
        super().build_extensions()


def packages() -> list[str]:
    """Every package of the tree, found rather than listed: a hand-kept list once left out
    localinfer.backends.rpc. setuptools' own discovery (`packages.find`) names a package
    after its folder, so it cannot find quant/ as localinfer_quant: each folder that
    package-dir maps is searched on its own, under its installed name. Namespace discovery,
    so that data folders (native/c/, quant/data/) are packages too, as setuptools asks."""
    mapped = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    skip = ["*__pycache__"]
    found = find_namespace_packages(str(HERE), include=["localinfer", "localinfer.*"], exclude=skip)
    for name, folder in mapped.items():
        found += [name, *(f"{name}.{sub}" for sub in find_namespace_packages(str(HERE / folder), exclude=skip))]
    return found


ckernels = Extension(
    "localinfer_native._ckernels",
    sources=sorted(glob("native/c/*.c")),
    depends=sorted(glob("native/c/*.h")),
    include_dirs=["native/c"],
    libraries=[] if sys.platform == "win32" else ["m"],
    optional=True,
)

setup(packages=packages(), ext_modules=[ckernels], cmdclass={"build_ext": BuildNative})
