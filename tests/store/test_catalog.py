"""models/catalog.toml as the loader reads it: every hub entry names its file exactly, with
a sha256 and a revision of the forms the hub uses, and a bare family name still means the
family's first (smallest) model when larger ones of the family follow it."""

from __future__ import annotations

import re

from localinfer.store.catalog import load_catalog
from localinfer.store.refs import resolve

MOE = {"qwen3:30b-a3b": "Qwen/Qwen3-30B-A3B-GGUF", "qwen3-coder:30b-a3b": "unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF", "gpt-oss:20b": "ggml-org/gpt-oss-20b-GGUF"}
# issue 49's embedding and reranking models, by the names Ollama's clients use
EMBEDDERS = {
    "nomic-embed-text": "nomic-ai/nomic-embed-text-v1.5-GGUF",
    "all-minilm": "leliuga/all-MiniLM-L6-v2-GGUF",
    "bge-m3": "gpustack/bge-m3-GGUF",
    "qwen3-embedding:0.6b": "Qwen/Qwen3-Embedding-0.6B-GGUF",
    "bge-reranker-v2-m3": "gpustack/bge-reranker-v2-m3-GGUF",
}


def test_every_entry_is_well_formed() -> None:
    for alias, e in load_catalog().entries.items():
        assert (e.package is None) != (e.repo is None) and e.file and e.file.endswith(".gguf") and e.checked, alias
        assert e.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.sha256), alias
        assert e.revision == "main" or re.fullmatch(r"[0-9a-f]{40}", e.revision), alias


def test_the_newer_hub_entries_are_pinned_and_hashed() -> None:
    """Issue 47's and 49's entries: each at a commit of its repo (issue 47's publishers have
    replaced files under one name), with the sha256 pull checks (docs/models.md has the evidence)."""
    catalog = load_catalog()
    for alias, repo in (MOE | EMBEDDERS).items():
        src = resolve(alias)
        assert (src.repo, src.revision, src.sha256) == (repo, catalog.entries[alias].revision, catalog.entries[alias].sha256), alias
        assert src.revision != "main" and src.sha256, alias


def test_a_family_name_is_its_first_model() -> None:
    catalog = load_catalog()
    assert catalog.get("qwen3").alias == "qwen3:0.6b"  # not the 18.6 GB mixture of experts listed after it
    assert catalog.get("gpt-oss").alias == "gpt-oss:20b" and catalog.get("qwen3-coder").alias == "qwen3-coder:30b-a3b"


def test_an_embedding_model_says_what_it_is_and_its_context() -> None:
    """`list --all` shows the description: an embedder or reranker says which, and each
    names the context one input takes (not a chat model's 4096 default)."""
    catalog = load_catalog()
    for alias in EMBEDDERS:
        entry = catalog.entries[alias]
        assert ("reranking model" if "rerank" in alias else "embedding model") in entry.description, alias
        assert entry.defaults.get("ctx") in (512, 2048, 8192) and not entry.draft, alias
    assert catalog.get("qwen3-embedding").alias == "qwen3-embedding:0.6b" and catalog.get("qwen3").alias == "qwen3:0.6b"


def test_a_vision_entry_names_its_projector_in_its_repo() -> None:
    """Issue 50: a catalog entry's projector is a hub file of the same repo and revision, named as
    llama.cpp's converter names them (the loader looks for mmproj*.gguf beside the model), with a
    sha256 where one is known; gemma3:4b carries ggml-org's F16 projector (docs/models.md)."""
    vision = {alias: e for alias, e in load_catalog().entries.items() if e.mmproj_file}
    assert "gemma3:4b" in vision
    for alias, e in vision.items():
        assert e.repo and e.mmproj_file.startswith("mmproj") and e.mmproj_file.endswith(".gguf") and e.mmproj_file != e.file, alias
        assert e.mmproj_sha256 is None or re.fullmatch(r"[0-9a-f]{64}", e.mmproj_sha256), alias
        src = resolve(alias)
        assert (src.mmproj_file, src.mmproj_sha256) == (e.mmproj_file, e.mmproj_sha256), alias
    assert all(not e.mmproj_sha256 for e in load_catalog().entries.values() if not e.mmproj_file)
