"""docs/architecture.md names every module of the tree, and no module that is gone.

A module counts as named when the doc writes its path: in full (`localinfer/memory.py`,
`native/c/ops.c`, `bench/serve.py`) or, under localinfer/, from below it
(`engine/prefix.py`, `backends/native/memory.py`; never `native/memory.py`, which would be
the kernels' folder). Or when the layer diagram lists it in its folder's entry: the entry
opens with the folder at the diagram's folder column and runs to the next line that has
anything left of its names; a file in a subfolder counts after the subfolder's name there
(`rpc/ ... worker.py`). A package's __init__.py is named with its folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
SOURCES = ("localinfer", "native", "quant", "models")
MODULE = (".py", ".c", ".h")
FOLDER_COLUMN = 13  # " clients     localinfer/cli/": a layer's name, then its folders


def modules() -> list[str]:
    """Every module file under the four source folders, and bench/'s scripts."""
    found = [p for top in SOURCES for p in (ROOT / top).rglob("*") if p.suffix in MODULE and "__pycache__" not in p.parts]
    found += (ROOT / "bench").glob("*.py")
    return sorted(p.relative_to(ROOT).as_posix() for p in found)


def diagram_entries(doc: str) -> dict[str, str]:
    """The layer diagram's text per folder: {"localinfer/engine": "loader.py   MODEL ...", ...}."""
    blocks = doc.split("```")
    diagram = blocks[1] if len(blocks) > 2 else ""  # the doc's first code block
    entries: dict[str, str] = {}
    folder = None
    for line in diagram.splitlines():
        if line[: FOLDER_COLUMN + 1].strip():  # a layer's name or a new name in the folder column
            match = re.match(r"(\S+)/(\s|$)", line[FOLDER_COLUMN:])
            folder = match.group(1) if match else None
            if folder:
                entries[folder] = ""
        if folder:
            entries[folder] += line + "\n"
    return entries


def mentions(text: str, name: str, after_slash: bool = True) -> int | None:
    """Where `name` stands in `text` as a whole name (not inside c_ops.py or foo/engine/x.py), or None."""
    before = r"(?<![\w.-])" if after_slash else r"(?<![\w./-])"
    match = re.search(before + re.escape(name) + r"(?![\w])", text)
    return match.end() if match else None


def named(path: str, doc: str, entries: dict[str, str]) -> bool:
    """Is the module at `path` named by the doc, as the module docstring says?"""
    if path.endswith("/__init__.py") and named(path.removesuffix("__init__.py"), doc, entries):
        return True
    spellings = [path, path.removeprefix("localinfer/")] if path.count("/") > 1 else [path]
    if any(mentions(doc, spelling, after_slash=False) is not None for spelling in spellings):
        return True
    homes = [folder for folder in entries if path.startswith(folder + "/")]
    if not homes:
        return False
    home = max(homes, key=len)
    text = entries[home]
    for part in re.findall(r"[^/]+/|[^/]+$", path.removeprefix(home + "/")):  # "native/", "memory.py": in order
        at = mentions(text, part)
        if at is None:
            return False
        text = text[at:]
    return True


def test_every_module_is_named() -> None:
    doc = DOC.read_text()
    entries = diagram_entries(doc)
    assert {"localinfer/engine", "localinfer/backends", "native", "quant", "bench"} <= set(entries), f"the diagram's folders, as read: {sorted(entries)}"
    missing = [path for path in modules() if not named(path, doc, entries)]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_the_diagram_names_no_module_that_is_gone() -> None:
    """Every module name in a folder's entry is a file under that folder (or one planned), or
    at the repository's top (setup.py)."""
    on_disk = set(modules())
    for folder, text in diagram_entries(DOC.read_text()).items():
        for name in re.findall(r"(?<![\w./-])([\w-]+\.(?:py|c|h))(?![\w])", text):
            here = {p for p in on_disk if p.startswith(folder + "/") and p.rsplit("/", 1)[-1] == name}
            assert here or (ROOT / name).is_file(), f"docs/architecture.md lists {name} under {folder}/, which has no such file"


@pytest.mark.parametrize(
    ("path", "doc", "expected"),
    [
        ("localinfer/backends/native/memory.py", "x `backends/native/memory.py`", True),
        ("localinfer/backends/native/memory.py", "x native/memory.py, localinfer/memory.py", False),
        ("localinfer/engine/prefix.py", "x localinfer/engine/prefix.py", True),
        ("localinfer/engine/prefix.py", "the prefix, prefix.py", False),
        ("native/c_ops.py", "```\n kernels     native/ → x   numba_ops.py, ops.c\n```", False),
        ("native/c/ops.c", "```\n kernels     native/ → x   ops.c over c/: decode.c\n```", False),
        ("native/c/ops.c", "```\n kernels     native/ → x   c/: ops.c\n             bench/  y\n```", True),
    ],
)
def test_a_name_counts_only_whole(path: str, doc: str, expected: bool) -> None:
    """The matching itself: a longer path's tail, a file name's tail, a word, or a file
    before its subfolder's name is no name."""
    assert named(path, doc, diagram_entries(doc)) is expected
