"""Pulling from a file-based fake hub on loopback, through the real huggingface-hub client."""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ..conftest import run_cli, start_cli
from ..fakehub import FakeHub


@pytest.fixture()
def hub_root(tmp_path: Path, model_path: Path) -> Path:
    """A hub with one repo holding the embedded model under a k-quant-style name, plus a decoy."""
    repo = tmp_path / "hub" / "acme" / "tiny-GGUF"
    repo.mkdir(parents=True)
    (repo / "tiny-Q4_1.gguf").symlink_to(model_path)
    (repo / "README.md").write_text("# tiny\n")
    return tmp_path / "hub"


def hub_env(hub: FakeHub, home: Path) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1", "LOCALINFER_HOME": str(home)}

def point_this_process_at(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub in this process (not a CLI's) asks `hub`: its endpoint, and the
    constants it fixed when first imported, which an earlier test may have done."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", hub.url)
    monkeypatch.setattr("huggingface_hub.constants.HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr("huggingface_hub.hf_api.api.endpoint", hub.url)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")



def ggufs_under(home: Path) -> list[Path]:
    return [p for p in (home / "models").rglob("*.gguf") if p.is_file()] if (home / "models").exists() else []


def test_pull_list_run_rm(hub_root: Path, isolated_home: Path, model_path: Path) -> None:
    with FakeHub(hub_root) as hub:
        env = hub_env(hub, isolated_home)
        r = run_cli("pull", "acme/tiny-GGUF:Q4_1", "--json", env=env)
        assert r.returncode == 0, r.stderr
        pulled = json.loads(r.stdout)
        assert Path(pulled["path"]).read_bytes() == model_path.read_bytes()
        names = [m["name"] for m in json.loads(run_cli("list", "--json", env=env).stdout)]
        assert "acme/tiny-GGUF:Q4_1" in names
    # Once pulled, it runs with the hub gone.
    offline = {"LOCALINFER_HOME": str(isolated_home)}
    r = run_cli("run", "acme/tiny-GGUF:Q4_1", "--temperature", "0", "--max-tokens", "8", "--json", "Hello", env=offline)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["text"]
    assert run_cli("rm", "acme/tiny-GGUF:Q4_1", env=offline).returncode == 0
    assert ggufs_under(isolated_home) == []
    assert "acme/tiny-GGUF:Q4_1" not in run_cli("list", "--json", env=offline).stdout


def test_missing_quant_lists_what_the_repo_has(hub_root: Path, isolated_home: Path) -> None:
    with FakeHub(hub_root) as hub:
        r = run_cli("pull", "acme/tiny-GGUF:Q8_0", env=hub_env(hub, isolated_home))
    assert r.returncode == 1 and "no Q8_0 file" in r.stderr and "Q4_1" in r.stderr


def test_missing_repo(hub_root: Path, isolated_home: Path) -> None:
    with FakeHub(hub_root) as hub:
        r = run_cli("pull", "acme/absent-GGUF", env=hub_env(hub, isolated_home))
    assert r.returncode == 1 and "no such model" in r.stderr and "Traceback" not in r.stderr


def test_interrupted_pull_leaves_no_model_and_resumes(hub_root: Path, isolated_home: Path, model_path: Path) -> None:
    with FakeHub(hub_root, delay=0.01) as hub:  # ~6 MB/s: the 98 MB file takes ~15 s
        proc = start_cli("pull", "acme/tiny-GGUF:Q4_1", env=hub_env(hub, isolated_home),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        partial = []
        deadline = time.time() + 60
        while time.time() < deadline and not partial:
            time.sleep(0.2)
            partial = [p for p in (isolated_home / "models").rglob("*.partial") if p.stat().st_size > 1_000_000] if (isolated_home / "models").exists() else []
        assert partial, "the download should have started"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) != 0
        assert ggufs_under(isolated_home) == [], "an interrupted pull must not leave a .gguf"
        assert "tiny" not in run_cli("list", "--json", env=hub_env(hub, isolated_home)).stdout
        done_before = partial[0].stat().st_size

        hub.delay = 0
        hub.log.clear()
        r = run_cli("pull", "acme/tiny-GGUF:Q4_1", "--json", env=hub_env(hub, isolated_home))
        assert r.returncode == 0, r.stderr
        assert Path(json.loads(r.stdout)["path"]).read_bytes() == model_path.read_bytes()
    # the second pull asked only for the rest, and the hub sent only the rest
    (resumed,) = hub.log
    size = model_path.stat().st_size
    assert 0 < done_before < size
    assert resumed.range == f"bytes={done_before}-"
    assert resumed.bytes_sent == size - done_before


def test_checksum_mismatch_deletes_the_file(hub_root: Path, isolated_home: Path, monkeypatch) -> None:
    from localinfer.errors import DownloadError
    from localinfer.store.pull import pull
    from localinfer.store.refs import ModelSource

    with FakeHub(hub_root) as hub:
        point_this_process_at(hub, monkeypatch)
        src = ModelSource(name="bad", kind="hub", repo="acme/tiny-GGUF", file="tiny-Q4_1.gguf", sha256="0" * 64)
        with pytest.raises(DownloadError, match="sha256"):
            pull(src)
    assert ggufs_under(isolated_home) == []


def test_etag_sha256_mismatch_deletes_the_download(hub_root: Path, isolated_home: Path) -> None:
    """No catalog hash for a hub reference: the hub's ETag (an LFS file's sha256) is checked."""
    with FakeHub(hub_root, etag=lambda sha: "f" * 64) as hub:
        r = run_cli("pull", "acme/tiny-GGUF:Q4_1", env=hub_env(hub, isolated_home))
    assert r.returncode == 1 and "failed its sha256 check" in r.stderr and "Traceback" not in r.stderr
    assert ggufs_under(isolated_home) == []
    assert list((isolated_home / "models").rglob("*.partial")) == []
    assert run_cli("list", "--json", env={"LOCALINFER_HOME": str(isolated_home)}).stdout.count("tiny") == 0


def test_no_published_hash_is_said_not_skipped(hub_root: Path, isolated_home: Path, model_path: Path) -> None:
    with FakeHub(hub_root, etag=lambda sha: "abc-123") as hub:
        r = run_cli("pull", "acme/tiny-GGUF:Q4_1", "--json", env=hub_env(hub, isolated_home))
    assert r.returncode == 0, r.stderr
    assert "no sha256 is published" in r.stderr and "cannot be verified" in r.stderr
    pulled = json.loads(r.stdout)
    assert pulled["verified"] is False
    assert Path(pulled["path"]).read_bytes() == model_path.read_bytes()
