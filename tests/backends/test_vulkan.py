"""llama.cpp's Vulkan backend (issue 51), where this llama.cpp build has it and a Vulkan device
answers: a discrete GPU, else the first device `vulkaninfo --summary` lists (Mesa's lavapipe on
a machine without a GPU, a software device that ggml's Vulkan backend uses only when
GGML_VK_VISIBLE_DEVICES names it, which these tests do). Skipped elsewhere, with the reason.

The default install has no Vulkan backend; run these from a second environment:

    LOCALINFER_BACKEND=vulkan LOCALINFER_VENV=.venv-vulkan ./install.sh --test
    .venv-vulkan/bin/python -m pytest tests/backends/test_vulkan.py

Everything runs in processes of its own (the CLI, `serve`, bench/gpu_agreement.py), with the
device shown (GGML_VK_VISIBLE_DEVICES=N) or hidden (empty: the same build on the CPU alone,
the reference): ggml reads that once, when it first lists devices.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from localinfer.devices import backends, vulkan_devices

from ..conftest import THREADS, cli_env, run_cli
from ..reliability import serving
from ..server.test_serve import Server

ROOT = Path(__file__).resolve().parents[2]
CUDA_KLD = {"mean": 0.0171, "p99": 0.0922}  # docs/benchmarks.md, issue 33: CUDA on an H200 against the same build's CPU


def _device() -> tuple[int | None, str]:
    """The Vulkan device the tests run on (index, name), or (None, why not)."""
    if "Vulkan" not in backends():
        return None, "this llama.cpp build has no Vulkan backend (LOCALINFER_BACKEND=vulkan ./install.sh into a venv of its own)"
    devices = vulkan_devices()
    if not devices:
        return None, "no Vulkan device: vulkaninfo --summary lists none (Debian: apt install mesa-vulkan-drivers vulkan-tools)"
    chosen = next((d for d in devices if d.taken_by_default), devices[0])
    return chosen.index, chosen.name


INDEX, NAME = _device()
pytestmark = pytest.mark.skipif(INDEX is None, reason=NAME)
SHOWN = {"GGML_VK_VISIBLE_DEVICES": str(INDEX)}
HIDDEN = {"GGML_VK_VISIBLE_DEVICES": ""}  # the same build, no Vulkan device: llama.cpp's CPU backend


def test_doctor_lists_the_device_and_offload() -> None:
    report = json.loads(run_cli("doctor", "--json", env=SHOWN).stdout)
    [vulkan] = [d for d in report["llama_cpp"]["devices"] if d["name"].startswith("Vulkan")]
    assert vulkan["name"] == "Vulkan0" and NAME.split(" (")[0] in vulkan["description"] and vulkan["total_bytes"] > 0
    assert report["llama_cpp"]["gpu_offload"] is True and "Vulkan" in report["llama_cpp"]["gpu_backends"]
    assert any(d["name"] == NAME for d in report["vulkan_devices"])


def test_greedy_f32_is_the_cpus_and_q4_1_diverges_no_more_than_on_cuda(tmp_path: Path, f32_path: Path, model_path: Path) -> None:
    """bench/gpu_agreement.py's two steps: the reference on the CPU (the device hidden), then
    every layer on the Vulkan device: 64 greedy tokens of the F32 model, and the Q4_1 model's
    next-token distributions over 255 positions of held-out text."""
    pair = ["--f32", str(f32_path), "--q4", str(model_path)]
    agreement = [sys.executable, str(ROOT / "bench" / "gpu_agreement.py")]
    subprocess.run([*agreement, "dump", "--out", str(tmp_path / "cpu.npz"), *pair], env=cli_env(HIDDEN), check=True, capture_output=True, timeout=1200)
    subprocess.run([*agreement, "check", "--ref", str(tmp_path / "cpu.npz"), "--gpu-layers", "all", "--json", str(tmp_path / "vulkan.json"), *pair],
                   env=cli_env(SHOWN), check=True, capture_output=True, timeout=1200)  # fmt: skip
    result = json.loads((tmp_path / "vulkan.json").read_text())
    print(json.dumps(result, indent=1))  # the figures the closing note quotes
    assert result["greedy_identical"] and result["greedy_tokens"] == 64, result
    assert result["kld_mean"] <= CUDA_KLD["mean"] and result["kld_p99"] <= CUDA_KLD["p99"], result


@pytest.mark.parametrize("cache", ["f16", "q8_0"])
def test_every_layer_on_the_device_in_each_cache_type_and_auto_says_why(cache: str, f32_path: Path) -> None:
    """--gpu-layers auto puts every layer on the device; `--engine auto` says the native engine
    does not offload; an f16 and a q8_0 KV cache (flash attention on, which a quantized V needs)
    answer greedily as the CPU does."""
    args = ["run", str(f32_path), "Name three colours.", "--temperature", "0", "--max-tokens", "24", "--cache-type", cache, "--threads", str(THREADS), "--no-prompt-cache"]
    shown = run_cli(*args, "--gpu-layers", "auto", "--verbose", env=SHOWN)
    assert shown.returncode == 0, shown.stderr
    assert "the native engine does not run GPU offload" in shown.stderr and "on Vulkan0" in shown.stderr, shown.stderr
    hidden = run_cli(*args, "--gpu-layers", "0", env=HIDDEN)
    assert hidden.returncode == 0, hidden.stderr
    assert shown.stdout == hidden.stdout


def test_the_prompt_cache_keeps_the_device_in_its_identity(tmp_path: Path, f32_path: Path) -> None:
    """Blocks computed on the Vulkan device are not handed to the CPU, nor the CPU's to the
    device: each placement is its own cache identity, naming the device."""
    args = ["run", str(f32_path), "Why is the sky blue?", "--temperature", "0", "--max-tokens", "4", "--threads", str(THREADS), "--cache-dir", str(tmp_path)]
    assert run_cli(*args, "--gpu-layers", "all", env=SHOWN).returncode == 0
    assert run_cli(*args, "--gpu-layers", "0", env=HIDDEN).returncode == 0
    identities = [json.loads(p.read_text()) for p in tmp_path.glob("*/identity.json")]
    assert len(identities) == 2, identities
    [on_device] = [i for i in identities if i.get("gpu_layers")]
    assert any(gpu.startswith("Vulkan0: ") for gpu in on_device["gpus"]), on_device


@pytest.fixture()
def vulkan_server(f32_path: Path):  # type: ignore[no-untyped-def]
    servers: list[Server] = []

    def start(*args: str) -> Server:
        s = Server(str(f32_path), "--draft", "none", "--gpu-layers", "all", *args, env=SHOWN)
        servers.append(s)
        return s

    yield start
    for s in servers:
        code, log = s.stop()
        assert code == 0 and "Traceback" not in log, log


def test_serve_streams_four_answers_at_once_each_its_own(vulkan_server) -> None:  # type: ignore[no-untyped-def]
    s = vulkan_server("--parallel", "4")
    prompts = serving.distinct_prompts(4, seed=5)
    alone = serving.references(s.url, prompts, 24)
    answers: dict[str, str] = {}
    threads = [threading.Thread(target=lambda p=p: answers.__setitem__(p, serving.stream_chat(s.url, p, 24).text)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert answers == alone


def test_disconnects_free_every_slot_and_cell(vulkan_server) -> None:  # type: ignore[no-untyped-def]
    s = vulkan_server("--parallel", "2", "--max-queue", "8")
    report = serving.disconnects(s.url, parallel=2, rounds=2)
    assert report["problems"] == [], report
    dropped = report["dropped"]
    assert dropped["mid_decode"] == dropped["mid_prefill"] == dropped["non_streamed"] == 2 and dropped["queued"] >= 1, report
