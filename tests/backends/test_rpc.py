"""Several machines through llama.cpp's RPC backend, on loopback: real `localinfer worker`
processes, the real CLI and a real server, the local llama.cpp run as the reference. Every
wait is bounded; a worker is always stopped."""

from __future__ import annotations

import json
import select
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from localinfer.backends.llamacpp import supports_rpc
from tests.conftest import run_cli, start_cli

pytestmark = pytest.mark.skipif(not supports_rpc(), reason="this llama.cpp build has no RPC backend (install.sh builds it with -DGGML_RPC=ON)")

PROMPT = "Write three sentences about a lighthouse keeper and her cat."
COMMON = ("--engine", "llama.cpp", "--ctx", "256", "--temperature", "0", "-n", "24", "--draft", "none", "--no-prompt-cache")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """`localinfer worker` on loopback, started and waited for until it prints its line."""

    def __init__(self, mem: str, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.port = port or free_port()
        self.endpoint = f"{host}:{self.port}"
        self.proc = start_cli("worker", "--host", host, "--port", str(self.port), "--mem", mem, "--threads", "1",
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        assert ready, "the worker printed nothing in 60 s"
        self.line = self.proc.stdout.readline()
        assert "offers" in self.line, (self.line, self.proc.stderr.read() if self.proc.poll() is not None else "")

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, out, err


@pytest.fixture()
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.stop(signal.SIGKILL)


def test_a_model_split_across_two_workers_answers_as_it_does_alone(f32_path: Path, workers: list[Worker]) -> None:
    workers += [Worker("100MB"), Worker("300MB")]
    rpc = ",".join(w.endpoint for w in workers)
    local = run_cli("run", str(f32_path), PROMPT, *COMMON, "--json")
    split = run_cli("run", str(f32_path), PROMPT, *COMMON, "--json", "--verbose", "--rpc", rpc)
    assert local.returncode == 0 and split.returncode == 0, (local.stderr, split.stderr)
    alone, together = json.loads(local.stdout), json.loads(split.stdout)
    assert together["text"] == alone["text"] and together["usage"] == alone["usage"]  # greedy, F32: the same tokens
    assert together["engine"] == "llama.cpp"  # in a child process of its own, but named for the engine it runs
    placement = next(line for line in split.stderr.splitlines() if "on this machine" in line)
    assert "layers 0-" in placement and f"on {workers[0].endpoint}" in placement and f"and the output on {workers[1].endpoint}" in placement


def test_the_quantized_model_split_agrees_as_llama_cpp_agrees_with_itself(model_path: Path, workers: list[Worker]) -> None:
    """Q4_1: the split's logits against the local run's, within what llama.cpp's own two ways
    of computing the same logits differ by (the prompt's last row in one batch, or fed alone)."""
    import numpy as np

    from localinfer.backends.base import Batch, LoadParams
    from localinfer.backends.isolated import IsolatedBackend
    from localinfer.backends.llamacpp import LlamaCppBackend

    workers += [Worker("40MB")]
    local = LlamaCppBackend.load(model_path, LoadParams(n_ctx=256, n_threads=1))
    tokens = local.tokenize(PROMPT)
    whole = local.forward(Batch.for_sequence(tokens, 0))[0]
    local.kv_truncate(0, len(tokens) - 1)
    alone = local.forward(Batch.for_sequence(tokens[-1:], len(tokens) - 1))[0]
    local.close()
    split = IsolatedBackend("llama.cpp", model_path, LoadParams(n_ctx=256, n_threads=1, n_gpu_layers=6, rpc_split=((workers[0].endpoint, 6),)))
    try:
        remote = split.forward(Batch.for_sequence(tokens, 0))[0]
    finally:
        split.close()
    own = float(np.abs(whole - alone).max())
    assert float(np.abs(remote - whole).max()) <= max(own, 1e-3), own
    assert int(np.argmax(remote)) == int(np.argmax(whole))


def test_a_worker_killed_mid_stream_ends_the_request_and_the_server_recovers(f32_path: Path, workers: list[Worker]) -> None:
    from tests.server.test_serve import Server

    workers += [Worker("300MB")]
    server = Server(str(f32_path), "--engine", "llama.cpp", "--ctx", "512", "--parallel", "1", "--draft", "none", "--rpc", workers[0].endpoint)
    try:
        client = server.client()
        stream = client.chat.completions.create(model=str(f32_path), messages=[{"role": "user", "content": PROMPT}], max_tokens=200,
                                                temperature=0.7, stream=True, extra_body={"ignore_eos": True})  # fmt: skip
        finish = None
        with pytest.raises(openai.APIError) as failed:  # the error event after the last chunk
            for i, chunk in enumerate(stream):
                if i == 2:
                    workers[0].proc.kill()
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
        assert finish == "error" and "Remote RPC server crashed" in str(failed.value) and f"nothing listens at {workers[0].endpoint}" in str(failed.value)
        health = httpx.get(server.url + "/health", timeout=10)
        assert health.status_code == 503 and "engine process ended" in health.json()["error"]
        refused = httpx.post(server.url + "/v1/completions", json={"model": str(f32_path), "prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert refused.status_code == 503 and f"nothing listens at {workers[0].endpoint}" in refused.text
        workers.append(Worker("300MB", port=workers[0].port))
        again = client.completions.create(model=str(f32_path), prompt="The sea is", max_tokens=4, temperature=0)
        assert again.choices[0].finish_reason == "length"
        assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    finally:
        code, log = server.stop()
    assert code == 0 and "Traceback" not in log


def old_worker(version: tuple[int, int, int]) -> tuple[int, threading.Thread]:
    """A listener that answers HELLO as a worker of another RPC protocol version would (we
    cannot build an old llama.cpp here): its size, then major, minor, patch."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(30)

    def answer() -> None:
        with listener:
            for _ in range(2):
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    conn.recv(1 + 8 + 24)
                    conn.sendall(struct.pack("<Q", 28) + bytes([*version, 0]) + bytes(24))

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def test_bad_rpc_values_are_one_line_each(model_path: Path) -> None:
    idle = free_port()
    old, _ = old_worker((6, 1, 0))
    cases = {
        "127.0.0.1": "has no port",
        "bad_host!:50052": "is not a host name",
        "127.0.0.1:99999": "not between 1 and 65535",
        f"127.0.0.1:{idle},127.0.0.1:{idle}": "twice",
        f"127.0.0.1:{idle}": f"nothing listens at 127.0.0.1:{idle}",
        f"127.0.0.1:{old}": "protocol 6.1.0",
    }
    for value, said in cases.items():
        r = run_cli("run", str(model_path), "Hi", "--rpc", value, "-n", "2")
        assert r.returncode != 0 and said in r.stderr and "Traceback" not in r.stderr, (value, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (value, r.stderr)
    native = run_cli("run", str(model_path), "Hi", "--engine", "native", "--rpc", f"127.0.0.1:{idle}")
    assert native.returncode == 1 and "--rpc needs an engine that reaches RPC workers" in native.stderr and len(native.stderr.strip().splitlines()) == 1


def test_doctor_checks_each_worker_in_one_table(workers: list[Worker]) -> None:
    workers += [Worker("48MB")]
    idle = free_port()
    r = run_cli("doctor", "--json", "--rpc", f"{workers[0].endpoint},127.0.0.1:{idle}")
    assert r.returncode == 1, r.stderr  # one worker does not answer
    rows = json.loads(r.stdout)["rpc_workers"]
    assert rows[0]["ok"] and rows[0]["offered_bytes"] == 48 << 20 and rows[0]["protocol"] == rows[0]["compatible_with"]
    assert rows[0]["backend"] == "CPU" and rows[0]["devices"] == 1  # this build's worker serves the CPU (no GPU here)
    assert not rows[1]["ok"] and "nothing listens" in rows[1]["error"]
    table = run_cli("doctor", "--rpc", workers[0].endpoint)
    assert table.returncode == 0 and "RPC workers" in table.stdout and "48 MiB of" in table.stdout


def test_a_worker_prints_one_line_refuses_a_taken_port_and_stops_on_sigterm(workers: list[Worker]) -> None:
    workers += [Worker("32MB")]
    assert workers[0].line.startswith(f"localinfer worker on {workers[0].endpoint}: offers 32 MiB of CPU")
    taken = run_cli("worker", "--port", str(workers[0].port), timeout=60)
    assert taken.returncode == 1 and f"port {workers[0].port} on 127.0.0.1 is taken" in taken.stderr and taken.stdout == ""
    code, out, err = workers[0].stop(signal.SIGTERM)
    assert code == 0 and out.strip() == f"worker on {workers[0].endpoint} stopped" and "Traceback" not in err
    beyond = Worker("32MB", host="127.0.0.2")  # loopback still, but not 127.0.0.1: the warning
    workers.append(beyond)
    code, _, err = beyond.stop(signal.SIGINT)
    assert code == 0 and "no authentication" in err and "SSH tunnel" in err
    for bad, said in (("--mem", "0"), ("--port", "0"), ("--host", "::1")):
        r = run_cli("worker", bad, said, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bench_model_compares_no_worker_with_one_and_counts_round_trips(model_path: Path, workers: list[Worker]) -> None:
    workers += [Worker("160MB")]
    r = run_cli("bench", "model", str(model_path), "-p", "16", "-n", "8", "-r", "1", "-t", "1", "--rpc", "none", "--rpc", workers[0].endpoint, "--json")
    assert r.returncode == 0, r.stderr
    rows = {(row["rpc"], row["test"]): row for row in json.loads(r.stdout)}
    assert set(rows) == {("", "pp16"), ("", "tg8"), (workers[0].endpoint, "pp16"), (workers[0].endpoint, "tg8")}
    assert rows["", "tg8"]["round_trips_per_token"] is None
    trips = rows[workers[0].endpoint, "tg8"]["round_trips_per_token"]
    assert trips is not None and trips >= 1  # a token waits on the worker at least once: its activations or logits come back
    assert rows[workers[0].endpoint, "tg8"]["rpc_bytes_per_token"] >= 4 * 49152  # the logits alone: the worker holds the output layer
