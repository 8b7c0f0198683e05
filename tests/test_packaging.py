"""The wheel holds the whole source tree: every module and data file of localinfer/,
native/, quant/ and models/ under its installed name, and the C kernels' library.

A hand-kept package list once left out `localinfer.backends.rpc`; an editable install
(install.sh) never noticed, a wheel had no `--rpc`. setup.py now finds the packages, and
this holds what it finds to the tree on disk.

The wheel is built as CI can, offline: `pip wheel --no-deps --no-build-isolation
--no-index` with the venv's own setuptools, from a copy of the tree (a build writes
build/ and *.egg-info beside its sources, and the repository is shared). The C kernels
are compiled at -O0 through $LOCALINFER_CFLAGS (appended after setup.py's -O3): about
7 s of compiling instead of 40, and the test is about where the library lands, not how
fast it runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each source folder and the name it installs under: what the code imports.
INSTALLED = {"localinfer": "localinfer", "native": "localinfer_native", "quant": "localinfer_quant", "models": "localinfer_models"}
BUILD_INPUTS = ["pyproject.toml", "setup.py", "README.md"]


def source_files() -> list[str]:
    """The files of the four folders that git tracks or would track (ignored build output,
    such as an editable install's _ckernels library, left out), as they stand now."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *INSTALLED],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    return sorted(path for path in listed if (ROOT / path).is_file())


def installed_name(path: str) -> str:
    """Where a source file lies in the wheel: native/c/ops.c -> localinfer_native/c/ops.c."""
    folder, _, rest = path.partition("/")
    return f"{INSTALLED[folder]}/{rest}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    for path in BUILD_INPUTS + source_files():
        (tree / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tree / path)  # follows quant/data's link into tests/data
    env = {**os.environ, "LOCALINFER_CFLAGS": "-O0"}
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp / "dist"), str(tree)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    (built,) = (tmp / "dist").glob("localinfer-*.whl")
    return built


def test_the_wheel_holds_every_module_and_data_file(wheel: Path) -> None:
    sources = source_files()
    assert "localinfer/backends/rpc/worker.py" in sources and "models/catalog.toml" in sources  # the listing itself works
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [path for path in sources if installed_name(path) not in names]
    assert not missing, f"the wheel lacks {len(missing)} file(s) of the tree: {missing}"


def test_the_wheel_holds_the_c_kernels_library(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    built = [name for name in names if name.startswith("localinfer_native/_ckernels") and name.endswith(tuple(EXTENSION_SUFFIXES))]
    assert len(built) == 1, f"expected one C kernels library in localinfer_native/, found {built}"


def test_the_wheel_holds_nothing_beside_the_four_packages(wheel: Path) -> None:
    """Found packages only: no tests/, bench/ or a folder under its own name (quant/)."""
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    others = {top for top in tops - set(INSTALLED.values()) if not top.endswith(".dist-info")}
    assert set(INSTALLED.values()) <= tops and not others, sorted(tops)


def test_the_unpacked_wheel_imports_rpc_and_loads_its_c_kernels(wheel: Path, tmp_path: Path) -> None:
    """Run from the wheel's files alone, ahead of the editable install on sys.path: the
    module a wheel once lacked imports, and the C set loads from the library it carries."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import localinfer.backends.rpc.worker as w, localinfer_quant, localinfer_models\n"
        "from localinfer_native import load_kernels\n"
        "from localinfer_native.c_kernels import library_path\n"
        "load_kernels('c')\n"
        "print(w.__file__, localinfer_quant.__file__, localinfer_models.CATALOG, library_path(), sep='\\n')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    places = done.stdout.split()
    assert len(places) == 4 and all(Path(place).is_relative_to(site) for place in places), places
