"""models/catalog.toml as the loader reads it: every hub entry names its file exactly, with
a sha256 and a revision of the forms the hub uses, and a bare family name still means the
family's first (smallest) model when larger ones of the family follow it."""

from __future__ import annotations

import re

from localinfer.store.catalog import load_catalog
from localinfer.store.refs import resolve

MOE = {"qwen3:30b-a3b": "Qwen/Qwen3-30B-A3B-GGUF", "qwen3-coder:30b-a3b": "unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF", "gpt-oss:20b": "ggml-org/gpt-oss-20b-GGUF"}


def test_every_entry_is_well_formed() -> None:
    for alias, e in load_catalog().entries.items():
        assert (e.package is None) != (e.repo is None) and e.file and e.file.endswith(".gguf") and e.checked, alias
        assert e.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.sha256), alias
        assert e.revision == "main" or re.fullmatch(r"[0-9a-f]{40}", e.revision), alias


def test_the_mixtures_of_experts_are_pinned_and_hashed() -> None:
    """Issue 47's entries: each at a commit of its repo (their publishers have replaced files
    under one name), with the sha256 pull checks (docs/models.md has the evidence)."""
    catalog = load_catalog()
    for alias, repo in MOE.items():
        src = resolve(alias)
        assert (src.repo, src.revision, src.sha256) == (repo, catalog.entries[alias].revision, catalog.entries[alias].sha256), alias
        assert src.revision != "main" and src.sha256, alias


def test_a_family_name_is_its_first_model() -> None:
    catalog = load_catalog()
    assert catalog.get("qwen3").alias == "qwen3:0.6b"  # not the 18.6 GB mixture of experts listed after it
    assert catalog.get("gpt-oss").alias == "gpt-oss:20b" and catalog.get("qwen3-coder").alias == "qwen3-coder:30b-a3b"
