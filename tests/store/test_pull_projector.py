"""Pulling a vision model: its projector comes in the same pull, with the same checks (sha256,
progress, a `.partial` file renamed once checked, resume), lands beside the model where the
loader finds it, and goes with it on `rm`; `list` marks the model. From a file-based fake hub
on loopback through the real huggingface-hub client (tests/fakehub.py), with the tiny LLaVA
pair of tests/vision_models.py as the repo's files.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.vision_models import write_llava_text, write_mlp_projector, write_qwen2vl_projector

from ..conftest import run_cli
from ..fakehub import FakeHub
from .test_pull import ggufs_under, hub_env, point_this_process_at

REPO = "acme/tiny-llava-GGUF"
MODEL, MODEL_2, PROJECTOR, OTHER = "tiny-llava-F16.gguf", "tiny-llava-F32.gguf", "mmproj-tiny-llava-f16.gguf", "mmproj-tiny-llava-Q8_0.gguf"
WIDE = {"COLUMNS": "400"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def hub_root(tmp_path: Path) -> Path:
    """A repo holding the LLaVA text model (twice: two files, as two quantizations), its
    projector, and a second projector of another type (the F16 one is the one a pull takes)
    plus a README."""
    repo = tmp_path / "hub" / REPO
    repo.mkdir(parents=True)
    write_llava_text(repo / MODEL)
    write_llava_text(repo / MODEL_2, seed=1)
    write_mlp_projector(repo / PROJECTOR)
    write_qwen2vl_projector(repo / OTHER)
    (repo / "README.md").write_text("# tiny llava\n")
    return tmp_path / "hub"


@pytest.fixture()
def in_process_hub(hub_root: Path, monkeypatch: pytest.MonkeyPatch):
    """The fake hub for pulls in this process (catalog entries are built here, not resolved)."""
    with FakeHub(hub_root) as hub:
        point_this_process_at(hub, monkeypatch)
        yield hub


def catalog_source(hub_root: Path, mmproj_sha256: str | None, name: str = "tiny-llava:test", file: str = MODEL):
    """What `resolve` makes of a catalog entry with a projector, for the repo in `hub_root`."""
    from localinfer.store.catalog import CatalogEntry
    from localinfer.store.refs import _from_entry

    entry = CatalogEntry(alias=name, description="tiny LLaVA", repo=REPO, file=file, sha256=sha256(hub_root / REPO / file),
                         mmproj_file=PROJECTOR, mmproj_sha256=mmproj_sha256, checked=True)  # fmt: skip
    return _from_entry(entry)


def listed(env: dict[str, str]) -> dict[str, dict]:
    return {row["name"]: row for row in json.loads(run_cli("list", "--json", env=env).stdout)}


def test_pull_fetches_the_projector_beside_the_model_and_rm_removes_both(hub_root: Path, isolated_home: Path) -> None:
    repo = hub_root / REPO
    with FakeHub(hub_root) as hub:
        env = hub_env(hub, isolated_home)
        r = run_cli("pull", f"{REPO}:F16", "--json", env=env)
        assert r.returncode == 0, r.stderr
        files = {req.filename for req in hub.log}
    pulled = json.loads(r.stdout)
    model, projector = Path(pulled["path"]), Path(pulled["projector"]["path"])
    assert files == {MODEL, PROJECTOR}  # the F16 projector, not the other one
    assert projector.parent == model.parent and projector.name == PROJECTOR
    assert projector.read_bytes() == (repo / PROJECTOR).read_bytes() and model.read_bytes() == (repo / MODEL).read_bytes()
    assert pulled["projector"]["sha256"] == sha256(repo / PROJECTOR) and pulled["projector"]["size"] == projector.stat().st_size
    assert pulled["verified"] is True

    offline = {"LOCALINFER_HOME": str(isolated_home)}
    rows = listed(offline)
    assert rows[f"{REPO}:F16"]["vision"] is True and rows["smollm2:135m"]["vision"] is False
    table = run_cli("list", env=offline | WIDE).stdout.splitlines()
    column = table[0].index("VISION")
    marks = {line.split()[0]: line[column : column + 6].strip() for line in table[1:] if line.strip()}
    assert marks[f"{REPO}:F16"] == "yes" and marks["smollm2:135m"] == ""
    shown = json.loads(run_cli("show", f"{REPO}:F16", "--json", env=offline).stdout)
    assert Path(shown["vision"]["path"]) == projector

    freed = model.stat().st_size + projector.stat().st_size
    r = run_cli("rm", f"{REPO}:F16", env=offline)
    assert r.returncode == 0, r.stderr
    assert f"({freed / 1e6:.0f} MB)" in r.stderr
    assert ggufs_under(isolated_home) == []
    assert f"{REPO}:F16" not in listed(offline)


def test_a_projector_that_fails_its_check_leaves_no_model(hub_root: Path, isolated_home: Path) -> None:
    """The hub's sha256 (its ETag) of the projector is wrong: the pull fails in one line, the
    projector's download is deleted, and no manifest makes the model visible."""
    bad = sha256(hub_root / REPO / PROJECTOR)
    with FakeHub(hub_root, etag=lambda sha: "f" * 64 if sha == bad else sha) as hub:
        r = run_cli("pull", f"{REPO}:F16", env=hub_env(hub, isolated_home))
    assert r.returncode == 1 and "failed its sha256 check" in r.stderr and PROJECTOR in r.stderr and "Traceback" not in r.stderr
    assert not [p for p in ggufs_under(isolated_home) if p.name.startswith("mmproj")]
    assert list((isolated_home / "models").rglob("*.partial")) == []
    assert f"{REPO}:F16" not in listed({"LOCALINFER_HOME": str(isolated_home)})


def test_an_interrupted_projector_download_resumes(hub_root: Path, isolated_home: Path) -> None:
    """A projector's `.partial` file from an earlier pull: the next asks for the rest only."""
    source = hub_root / REPO / PROJECTOR
    half = source.stat().st_size // 2
    folder = isolated_home / "models" / REPO
    folder.mkdir(parents=True)
    (folder / (PROJECTOR + ".partial")).write_bytes(source.read_bytes()[:half])
    with FakeHub(hub_root) as hub:
        r = run_cli("pull", f"{REPO}:F16", "--json", env=hub_env(hub, isolated_home))
        assert r.returncode == 0, r.stderr
        (resumed,) = [req for req in hub.log if req.filename == PROJECTOR]
    assert resumed.range == f"bytes={half}-" and resumed.bytes_sent == source.stat().st_size - half
    assert Path(json.loads(r.stdout)["projector"]["path"]).read_bytes() == source.read_bytes()


def test_a_catalog_entry_pulls_its_projector_where_the_loader_finds_it(hub_root: Path, in_process_hub: FakeHub) -> None:
    from localinfer.engine.loader import LoadOptions, open_engine
    from localinfer.store import manifests
    from localinfer.store.pull import pull

    src = catalog_source(hub_root, sha256(hub_root / REPO / PROJECTOR))
    warnings: list[str] = []
    progress: list[tuple[int, int]] = []
    path = pull(src, lambda done, total: progress.append((done, total)), warn=warnings.append)
    pulled = manifests.find(src.name)
    assert warnings == [] and pulled is not None and pulled.verified
    both = (hub_root / REPO / MODEL).stat().st_size + (hub_root / REPO / PROJECTOR).stat().st_size
    assert progress[-1] == (both, both)  # the bar counts the projector's bytes too
    assert Path(pulled.projector) == path.parent / PROJECTOR and pulled.projector_sha256 == src.mmproj_sha256
    engine = open_engine(src.name, LoadOptions(ctx=256, threads=1))
    try:
        assert engine.projector is not None and engine.projector.path == Path(pulled.projector)
    finally:
        engine.close()


def test_a_catalog_projector_hash_that_does_not_match_is_refused(hub_root: Path, in_process_hub: FakeHub, isolated_home: Path) -> None:
    from localinfer.errors import DownloadError
    from localinfer.store import manifests
    from localinfer.store.pull import pull

    src = catalog_source(hub_root, "0" * 64)
    with pytest.raises(DownloadError, match=rf"{PROJECTOR}\S* failed its sha256 check"):
        pull(src)
    assert not (isolated_home / "models" / REPO / PROJECTOR).exists() and manifests.find(src.name) is None


@pytest.mark.parametrize("published", [True, False])
def test_a_catalog_projector_without_a_hash_is_checked_as_a_model_without_one(hub_root: Path, in_process_hub: FakeHub, published: bool) -> None:
    """No mmproj_sha256 in the entry: the hub's ETag is checked where it is a sha256, as for a
    model entry without one; where it is not, the pull warns and records the model unverified."""
    from localinfer.store import manifests
    from localinfer.store.pull import pull

    if not published:
        in_process_hub.etag = lambda sha: sha if sha != sha256(hub_root / REPO / PROJECTOR) else "abc-123"
    warnings: list[str] = []
    pull(catalog_source(hub_root, None), warn=warnings.append)
    pulled = manifests.find("tiny-llava:test")
    assert pulled is not None and pulled.verified is published
    assert pulled.projector_sha256 == sha256(hub_root / REPO / PROJECTOR)
    if published:
        assert warnings == []
    else:
        (warning,) = warnings
        assert f"no sha256 is published for {REPO}/{PROJECTOR}" in warning and "cannot be verified" in warning


def test_rm_keeps_a_projector_another_pull_still_uses(hub_root: Path, in_process_hub: FakeHub, isolated_home: Path) -> None:
    """Two names for models of one repo share its folder and its projector: removing one
    leaves the projector to the other; removing the last removes it."""
    from localinfer.store.pull import pull

    pull(catalog_source(hub_root, sha256(hub_root / REPO / PROJECTOR), name="tiny-llava:a"))
    pull(catalog_source(hub_root, sha256(hub_root / REPO / PROJECTOR), name="tiny-llava:b", file=MODEL_2))
    projector = isolated_home / "models" / REPO / PROJECTOR
    offline = {"LOCALINFER_HOME": str(isolated_home)}
    assert run_cli("rm", "tiny-llava:a", env=offline).returncode == 0
    assert projector.is_file() and not (projector.parent / MODEL).exists()
    assert listed(offline)["tiny-llava:b"]["vision"] is True
    assert run_cli("rm", "tiny-llava:b", env=offline).returncode == 0
    assert not projector.exists()
