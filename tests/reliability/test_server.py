"""The server under load, disconnects, a soak, and SIGTERM (issue 15, items 3-6): short
versions of bench/reliability.py's runs, on the F32 model (whose greedy answers do not
depend on how requests are batched), each against a fresh `localinfer serve` on loopback."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from ..server.test_serve import Server
from . import serving


@pytest.fixture()
def f32_server(f32_path: Path):  # type: ignore[no-untyped-def]
    servers: list[Server] = []

    def start(*args: str, path: Path = f32_path) -> Server:
        s = Server(str(path), "--draft", "none", *args)
        servers.append(s)
        return s

    yield start
    for s in servers:
        if s.proc.poll() is None:
            code, log = s.stop()
            assert code == 0, log
        assert "Traceback" not in s.log_text(), s.log_text()  # nothing the server did not handle


def test_load_completes_or_refuses_at_once_without_cross_talk(f32_server) -> None:
    s = f32_server("--parallel", "2", "--max-queue", "4")
    report = serving.load(s.url, parallel=2, clients=16, n_prompts=6, max_tokens=12)
    assert report["problems"] == [], report
    assert report["complete"] >= 6 and report["refused_503"] >= 1 and report["complete"] + report["refused_503"] == 16


def test_disconnects_free_every_slot_and_cell(f32_server) -> None:
    s = f32_server("--parallel", "2", "--max-queue", "8")
    report = serving.disconnects(s.url, parallel=2, rounds=3)
    assert report["problems"] == [], report
    dropped = report["dropped"]
    assert dropped["mid_decode"] == dropped["mid_prefill"] == dropped["non_streamed"] == 3 and dropped["queued"] >= 1, report


def test_a_short_soak_leaks_no_descriptors(f32_server) -> None:
    s = f32_server("--parallel", "4")
    report = serving.soak(s.url, s.proc.pid, parallel=4, sequential=12, concurrent=12, clients=4, warmup=8, every=6)
    assert not [p for p in report["problems"] if "RSS" not in p], report  # RSS over 24 requests is noise; bench/ holds the long run
    assert report["requests"] == 32 and report["fds"][1] <= report["fds"][0]


def test_sigterm_lets_requests_in_flight_finish_and_refuses_new_ones(f32_server) -> None:
    s = f32_server("--parallel", "2")
    prompts = serving.distinct_prompts(2, seed=3)
    refs = serving.references(s.url, prompts, 40)
    answers: list[serving.Answer] = []
    threads = [threading.Thread(target=lambda p=p: answers.append(serving.stream_chat(s.url, p, 40))) for p in prompts]
    for t in threads:
        t.start()
    deadline = time.time() + 30
    while s.metrics()["localinfer_requests_running"] < 2 and time.time() < deadline:
        time.sleep(0.02)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    late = httpx.post(s.url + "/v1/chat/completions", json=serving.chat_body("hi", 4, False), timeout=30)
    assert late.status_code == 503 and late.headers["retry-after"] == "1" and "shutting down" in late.json()["error"]["message"]
    for t in threads:
        t.join(timeout=60)
    assert sorted(a.text for a in answers) == sorted(refs.values()) and all(a.finish in ("stop", "length") for a in answers)
    assert s.proc.wait(timeout=60) == 0, s.log_text()


@pytest.mark.parametrize("engine", ["llama.cpp", "native"])
def test_a_model_file_truncated_or_deleted_while_served(f32_server, model_path: Path, tmp_path: Path, engine: str) -> None:
    """Deleted: the mapping keeps the data, serving goes on. Truncated: touching the mapped
    pages past the new end would be SIGBUS; the engine notices before its next forward, ends
    the requests with an error, answers 503 and stays up."""
    copy = shutil.copy(model_path, tmp_path / "model.gguf")
    s = f32_server("--engine", engine, path=Path(copy))
    body = {"model": str(copy), **serving.chat_body("Why is the sky blue?", 8, False)}
    first = httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]["content"]
    os.unlink(copy)
    shutil.copy(model_path, copy)  # a new file at the same path is another inode: ours is unchanged
    assert httpx.post(s.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]["content"] == first
    s2 = f32_server("--engine", engine, path=Path(copy))
    os.truncate(copy, os.path.getsize(copy) // 2)
    r = httpx.post(s2.url + "/v1/chat/completions", json={**body, "max_tokens": 4}, timeout=60)
    assert r.status_code == 503 and "truncated while loaded" in r.json()["error"]["message"], r.text
    health = httpx.get(s2.url + "/health", timeout=10)
    assert health.status_code == 503 and "truncated" in health.json()["error"]
    assert s2.proc.poll() is None  # still up, no SIGBUS


def test_a_non_streamed_request_whose_client_left_is_aborted(f32_server) -> None:
    """Was decoded to its end for nobody: 2,000 tokens holding a slot for half a minute."""
    s = f32_server("--parallel", "1")
    assert serving.drop_non_streamed(s.url, serving.chat_body("Write a very long story about the sea.", 2000, False), 1.0)
    deadline = time.time() + 5
    while s.metrics()["localinfer_requests_running"] and time.time() < deadline:
        time.sleep(0.05)
    m = s.metrics()
    assert m["localinfer_requests_running"] == 0 and m['localinfer_requests_total{status="disconnected"}'] == 1


def test_no_secret_reaches_the_log(model_path: Path) -> None:
    """Neither the API key (right or wrong), nor a prompt's text, nor an answer's."""
    key, secret_prompt = "sk-do-not-log-4f1e", "my bank PIN is 9137"
    s = Server(str(model_path), "--draft", "none", env={"LOCALINFER_API_KEY": key})
    try:
        for auth in (key, "sk-wrong-guess-77ab"):
            httpx.post(s.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {auth}"}, json=serving.chat_body(secret_prompt, 8, False), timeout=60)
        answer = s.client(key).chat.completions.create(model=s.model, messages=[{"role": "user", "content": secret_prompt}], max_tokens=8, temperature=0)
    finally:
        code, log = s.stop()
    assert code == 0 and "status=" in log  # it did log the requests
    text = answer.choices[0].message.content.strip()
    for secret in (key, "sk-wrong-guess-77ab", secret_prompt, *([text] if len(text) >= 10 else [])):  # a short answer could be anywhere
        assert secret not in log, secret


def test_a_chunked_body_past_the_limit_is_cut_off(model_path: Path) -> None:
    """The limit was read from Content-Length only: a chunked upload of any size was read whole."""
    s = Server(str(model_path), "--draft", "none")
    try:
        def chunks():  # 12 MiB with no Content-Length
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(12):
                yield b"x" * 2**20
            yield b'"}]}'

        r = httpx.post(s.url + "/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=60)
        assert r.status_code == 413 and "over 8 MiB" in r.json()["error"]["message"], r.text
        assert httpx.get(s.url + "/health", timeout=10).status_code == 200
    finally:
        assert s.stop()[0] == 0
