"""What a MODEL argument means: a catalog alias, a .gguf path, or a Hugging Face repo.

    smollm2:135m            catalog alias (models/catalog.toml)
    ./my-model.gguf         a file, run where it is, never copied
    owner/repo              a Hugging Face repo; we pick its Q4_K_M file, or the only one
    owner/repo:Q8_0         a Hugging Face repo, the file whose name carries that quantization
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from localinfer.errors import ModelNotFound
from localinfer.store import manifests
from localinfer.store.catalog import CatalogEntry, load_catalog

HUB_REF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<quant>[\w.-]+))?$")


@dataclass
class ModelSource:
    name: str  # how list/show/rm call it
    kind: str  # "path", "package" or "hub"
    path: Path | None = None  # for "path"
    package: str | None = None  # for "package"
    repo: str | None = None  # for "hub"
    file: str | None = None  # file inside the package or repo; None: choose by `quant`
    quant: str | None = None
    revision: str = "main"
    sha256: str | None = None
    defaults: dict[str, object] = field(default_factory=dict)
    draft: str | None = None  # the catalog's draft model for it (--draft auto)
    mmproj_file: str | None = None  # a vision model's projector in the same repo (the catalog's)
    mmproj_sha256: str | None = None


def _from_entry(entry: CatalogEntry) -> ModelSource:
    kind = "package" if entry.package else "hub"
    return ModelSource(
        name=entry.alias,
        kind=kind,
        package=entry.package,
        repo=entry.repo,
        file=entry.file,
        revision=entry.revision,
        sha256=entry.sha256,
        defaults=dict(entry.defaults),
        draft=entry.draft,
        mmproj_file=entry.mmproj_file,
        mmproj_sha256=entry.mmproj_sha256,
    )


def is_path_ref(ref: str) -> bool:
    """Does this reference name a file (rather than a catalog alias, a pulled name or a hub repo)?"""
    return ref.lower().endswith(".gguf") or ref.startswith((".", "~")) or os.sep in ref and Path(ref).exists()


def resolve(ref: str | None) -> ModelSource:
    catalog = load_catalog()
    if not ref:
        return _from_entry(catalog.default)
    if is_path_ref(ref):
        path = Path(ref).expanduser()
        if not path.exists():
            raise ModelNotFound(f"no such file: {ref}")
        return ModelSource(name=str(path), kind="path", path=path.resolve())
    entry = catalog.get(ref)
    if entry is not None:
        return _from_entry(entry)
    pulled = manifests.find(ref)
    if pulled is not None:
        return ModelSource(name=ref, kind="path", path=Path(pulled.path))
    match = HUB_REF.match(ref)
    if match:
        return ModelSource(name=ref, kind="hub", repo=match["repo"], quant=match["quant"])
    known = list(catalog.entries) + [m.name for m in manifests.all_models()]
    close = difflib.get_close_matches(ref, known, n=1, cutoff=0.5)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise ModelNotFound(f"unknown model '{ref}'; {hint}see 'localinfer list --all' for the catalog")
