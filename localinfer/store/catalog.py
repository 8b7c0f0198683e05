"""The catalog in models/catalog.toml: short aliases for known models and their defaults."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import lru_cache

from localinfer_models import CATALOG


@dataclass(frozen=True)
class CatalogEntry:
    alias: str  # family:tag, e.g. "smollm2:135m"
    description: str
    # Either a file inside an installed Python package...
    package: str | None = None
    # ...or a file in a Hugging Face repo.
    repo: str | None = None
    file: str | None = None
    revision: str = "main"
    sha256: str | None = None
    license: str | None = None
    checked: bool = False  # repo and file name verified against a public listing
    defaults: dict[str, object] = field(default_factory=dict)  # sampling defaults and ctx
    draft: str | None = None  # the catalog alias of a small model of the same vocabulary, for --draft auto
    # a vision model's projector (llama.cpp's mmproj GGUF), in the same repo at the same revision;
    # pull fetches it beside the model file, where the loader finds it
    mmproj_file: str | None = None
    mmproj_sha256: str | None = None


@dataclass(frozen=True)
class Catalog:
    default_alias: str
    entries: dict[str, CatalogEntry]

    def get(self, name: str) -> CatalogEntry | None:
        """An exact alias, or a bare family name ("smollm2") for the family's first entry."""
        if name in self.entries:
            return self.entries[name]
        family = [e for alias, e in self.entries.items() if alias.split(":")[0] == name]
        return family[0] if family else None

    @property
    def default(self) -> CatalogEntry:
        return self.entries[self.default_alias]


@lru_cache(maxsize=1)
def load_catalog() -> Catalog:
    data = tomllib.loads(CATALOG.read_text(encoding="utf-8"))
    entries = {alias: CatalogEntry(alias=alias, **spec) for alias, spec in data["models"].items()}
    return Catalog(default_alias=data["default"], entries=entries)
