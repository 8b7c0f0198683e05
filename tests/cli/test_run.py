"""`localinfer run` and friends as a user runs them: a real process on the real model."""

import json
import signal
import subprocess
import time

from ..conftest import read_gguf, run_cli, start_cli


def test_run_json_has_text_usage_and_timings() -> None:
    r = run_cli("run", "--temperature", "0", "--max-tokens", "24", "--json", "What is the capital of France?")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"].strip()
    assert out["finish_reason"] in ("stop", "length")
    assert out["usage"]["completion_tokens"] > 0 and out["usage"]["prompt_tokens"] > 0
    assert set(out["timings"]) >= {"load_ms", "ttft_ms", "tpot_ms", "tokens_per_s"}


def test_greedy_is_identical_across_runs() -> None:
    args = ("run", "--temperature", "0", "--max-tokens", "32", "--json", "Name three colours.")
    first, second = run_cli(*args), run_cli(*args)
    assert first.returncode == second.returncode == 0
    assert json.loads(first.stdout)["text"] == json.loads(second.stdout)["text"]


def test_prompt_on_stdin_streams_text() -> None:
    r = run_cli("run", "--temperature", "0", "--max-tokens", "16", "--verbose", input="Tell me about cats.")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "tok/s" in r.stderr and "TTFT" in r.stderr


def test_multibyte_prompt_and_answer_through_the_cli() -> None:
    r = run_cli("run", "--temperature", "0", "--max-tokens", "24", "--system", "Réponds en français.", "Écris « bonjour » et un émoji 🎉, s'il te plaît.")
    assert r.returncode == 0, r.stderr
    assert "\ufffd" not in r.stdout and r.stdout.strip()


def test_show_json_reports_the_gguf_metadata(model_path) -> None:
    r = run_cli("show", "smollm2:135m", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    ref = read_gguf(model_path)
    assert info["architecture"] == "llama"
    assert info["parameters"] == sum(int(t.n_elements) for t in ref.tensors)
    assert info["context_length"] == ref.fields["llama.context_length"].contents()
    assert info["chat_template"] == ref.fields["tokenizer.chat_template"].contents()
    assert info["license"] == "apache-2.0"
    assert info["file_size"] == model_path.stat().st_size


def test_show_human_output() -> None:
    r = run_cli("show", "smollm2:135m")
    assert r.returncode == 0 and "architecture" in r.stdout and "Q4_1" in r.stdout and "chat template" in r.stdout


def test_list_shows_the_embedded_default() -> None:
    r = run_cli("list", "--json")
    assert r.returncode == 0
    assert [m["name"] for m in json.loads(r.stdout)] == ["smollm2:135m"]
    r = run_cli("list", "--all", "--json")
    assert len(json.loads(r.stdout)) > 1


def test_doctor_reports_the_machine() -> None:
    r = run_cli("doctor", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["ram"]["total_bytes"] > 0
    assert any(d["type"] == "CPU" for d in report["llama_cpp"]["devices"])
    assert report["storage"]["models_dir"]
    kernels = report["native_kernels"]
    assert kernels["c"].startswith("c (") and kernels["numba"].startswith("numba ")
    assert kernels["auto"] == kernels["c"]  # this build compiled the C kernels


def test_doctor_shows_the_kv_cache_at_the_context_and_type_asked(model_path) -> None:
    """The cache's bytes follow --ctx and --cache-type: every layer's every position, as the
    model's metadata sizes it (f16: 2 bytes a value; q8_0: 34 bytes a block of 32)."""
    fields = read_gguf(model_path).fields
    arch = bytes(fields["general.architecture"].parts[-1]).decode()
    n_layer, n_embd = (int(fields[f"{arch}.{key}"].parts[-1][0]) for key in ("block_count", "embedding_length"))
    n_head, n_head_kv = (int(fields[f"{arch}.{key}"].parts[-1][0]) for key in ("attention.head_count", "attention.head_count_kv"))
    values = n_layer * n_head_kv * (n_embd // n_head) * 2  # K and V, one position
    memory = {}
    for ctx, cache in ((2048, "f16"), (8192, "f16"), (8192, "q8_0")):
        r = run_cli("doctor", str(model_path), "--ctx", str(ctx), "--cache-type", cache, "--json")
        assert r.returncode == 0, r.stderr
        memory[ctx, cache] = json.loads(r.stdout)["model"]["memory"]
        assert memory[ctx, cache]["ctx"] == ctx and memory[ctx, cache]["cache_types"] == [cache, cache]
    assert memory[2048, "f16"]["kv_cache_bytes"] == 2048 * values * 2
    assert memory[8192, "f16"]["kv_cache_bytes"] == 8192 * values * 2
    assert memory[8192, "q8_0"]["kv_cache_bytes"] == 8192 * values // 32 * 34
    text = run_cli("doctor", str(model_path), "--ctx", "8192", env={"COLUMNS": "400"}).stdout
    assert "memory at 8192 tokens of context: weights" in text and "KV cache" in text


def test_ctrl_c_stops_generation_cleanly() -> None:
    proc = start_cli(
        "run", "--temperature", "0", "--repeat-penalty", "1", "--max-tokens", "100000", "--ctx", "8192", "Write a very long story.",
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    first = proc.stdout.read(20)  # generation has started
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert first and proc.returncode == 130
    assert b"Traceback" not in err
