"""`localinfer bench serve` and `compare`: the metric arithmetic against a scripted server whose
delays are known, failures counted, bad input in one line, and a run against a real
`localinfer serve` on loopback. Every server here listens on 127.0.0.1 and every run is
bounded in requests and time."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from localinfer.benchmark import serve as sv

from ..conftest import run_cli

TTFT, ITL, TOKENS = 0.20, 0.05, 6  # what the scripted server does


def scripted_app() -> FastAPI:
    """Streams TOKENS chunks: the first after TTFT, the rest ITL apart. The user message picks
    a failure: "500" answers an error, "garbled" sends a malformed chunk, "cut" ends without [DONE]."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "scripted", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):  # type: ignore[no-untyped-def]
        body = await request.json()
        mode = body["messages"][-1]["content"]
        if mode == "500":
            return JSONResponse({"error": {"message": "scripted failure", "type": "server_error"}}, status_code=500)

        async def stream():  # type: ignore[no-untyped-def]
            await asyncio.sleep(TTFT)
            for i in range(TOKENS):
                if i:
                    await asyncio.sleep(ITL)
                yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]}) + "\n\n"
                if mode == "garbled":
                    yield "data: {not json\n\n"
            if mode == "cut":
                return
            yield "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS}}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def scripted() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(scripted_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        assert time.time() < deadline
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def level(url: str, prompts: list[str], concurrency: int = 2, slo_ttft: float | None = None) -> tuple[list[sv.RequestRecord], dict]:
    specs = [sv.RequestSpec([{"role": "user", "content": p}], TOKENS) for p in prompts]
    records, wall = asyncio.run(sv.run_level(url, "scripted", sv.Level(concurrency=concurrency), specs, 0, 10.0, {}))
    return records, sv.summarize(records, wall, slo_ttft, None)


def test_measured_ttft_and_itl_match_the_scripted_delays(scripted: str) -> None:
    records, summary = level(scripted, ["ok"] * 6)
    assert summary["ok"] == 6 and summary["failed"] == 0
    for r in records:  # a busy machine may read a chunk late, never early: tolerances lean that way
        assert TTFT - 0.005 <= r.ttft <= TTFT + 0.15 and r.tokens == TOKENS and len(r.itl) == TOKENS - 1
        assert sum(r.itl) == pytest.approx((TOKENS - 1) * ITL, abs=0.1)  # first to last chunk, whatever gaps a late read makes
        assert r.ttft <= r.e2e and r.e2e == pytest.approx(TTFT + (TOKENS - 1) * ITL, abs=0.15)
        assert r.tpot == pytest.approx(ITL, abs=0.025)
    assert summary["itl_s"]["p50"] == pytest.approx(ITL, abs=0.02)
    # 2 in flight, each request ~0.45 s: about 4.4 requests/s; all meet no SLO, so goodput equals it
    assert summary["request_throughput"] == pytest.approx(2 / (TTFT + (TOKENS - 1) * ITL), rel=0.25)
    assert summary["goodput"] == summary["request_throughput"]
    _, strict = level(scripted, ["ok"] * 4, slo_ttft=TTFT / 2)
    assert strict["goodput"] == 0 <= strict["request_throughput"]


def test_an_erroring_server_s_failures_are_counted(scripted: str) -> None:
    records, summary = level(scripted, ["ok", "500", "garbled", "cut", "ok"])
    assert (summary["requests"], summary["ok"], summary["failed"]) == (5, 2, 3)
    errors = " | ".join(summary["errors"])
    assert "HTTP 500: scripted failure" in errors and "JSONDecodeError" in errors and "without [DONE]" in errors


def test_a_request_that_takes_too_long_times_out(scripted: str) -> None:
    spec = sv.RequestSpec([{"role": "user", "content": "ok"}], TOKENS)
    records, _ = asyncio.run(sv.run_level(scripted, "scripted", sv.Level(concurrency=1), [spec], 0, TTFT / 2, {}))
    assert not records[0].ok and "timed out" in records[0].error


def test_open_loop_arrivals_follow_the_seeded_rate(scripted: str) -> None:
    specs = [sv.RequestSpec([{"role": "user", "content": "ok"}], TOKENS) for _ in range(12)]
    records, wall = asyncio.run(sv.run_level(scripted, "scripted", sv.Level(rate=20.0), specs, 7, 10.0, {}))
    again, _ = asyncio.run(sv.run_level(scripted, "scripted", sv.Level(rate=20.0), specs, 7, 10.0, {}))
    planned = sv.arrival_times(12, 20.0, 7)
    assert planned == sv.arrival_times(12, 20.0, 7) != sv.arrival_times(12, 20.0, 8)  # the seed fixes the arrivals
    for run in (records, again):  # none is sent before its time (a busy machine may send late, never early)
        assert all(r.sent >= p - 0.005 for r, p in zip(sorted(run, key=lambda r: r.sent), planned))
    gaps = np.diff([0.0, *sv.arrival_times(20000, 20.0, 1)])  # a Poisson process: exponential gaps of mean 1/rate
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.03) and gaps.std() == pytest.approx(1 / 20, rel=0.05)


def test_the_cli_against_a_real_localinfer_serve_compare_and_plot(tmp_path: Path) -> None:
    from ..server.test_serve import Server

    server = Server("--parallel", "2")
    try:
        args = ("bench", "serve", "--url", server.url, "-c", "1,2", "-n", "4", "--input-len", "12", "--output-len", "12", "--slo-ttft-ms", "100000")
        a = run_cli(*args, "-o", str(tmp_path / "a.json"), "--plot", str(tmp_path / "a.png"), timeout=240)
        assert a.returncode == 0, a.stderr
        assert a.stdout.count("| c=") == 2 and "written to" in a.stderr
        b = run_cli(*args, "--workload", "shared-prefix", "-o", str(tmp_path / "b.json"), timeout=240)
        assert b.returncode == 0, b.stderr
    finally:
        assert server.stop()[0] == 0
    run = json.loads((tmp_path / "a.json").read_text())
    for lvl in run["levels"]:
        s = lvl["summary"]
        assert s["ok"] == 4 and s["goodput"] <= s["request_throughput"]
        for r in lvl["records"]:
            assert r["ttft"] <= r["e2e"] and r["tokens"] == r["max_tokens"] and len(r["itl"]) == r["tokens"] - 1
    png = (tmp_path / "a.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    import matplotlib.image

    assert matplotlib.image.imread(tmp_path / "a.png").shape[:2] > (300, 600)
    from localinfer.benchmark.plot import terminal

    drawn = terminal(run)  # what a terminal gets after the table
    assert "latency against load" in drawn and "TTFT p50" in drawn and "concurrency" in drawn
    c = run_cli("bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert c.returncode == 0 and "| c=1 | TTFT p50 ms |" in c.stdout and "B/A" in c.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        (("serve", "--url", "http://127.0.0.1:9"), "cannot reach"),
        (("serve", "--url", "ftp://x"), "not an http(s) URL"),
        (("serve", "-c", "2", "--rate", "1"), "not both"),
        (("serve", "--workload", "poetry"), "not one of"),
        (("serve", "-c", "0"), "between 1 and"),
        (("serve", "--rate", "-1"), "more than 0"),
        (("compare", "/nonexistent/a.json", "/nonexistent/b.json"), "No such file"),
    ],
)
def test_bad_input_is_one_line(args: tuple[str, ...], says: str) -> None:
    out = run_cli("bench", *args, timeout=60)
    assert out.returncode in (1, 2) and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_model_the_server_does_not_have(scripted: str, tmp_path: Path) -> None:
    out = run_cli("bench", "serve", "--url", scripted, "--model", "nope", timeout=60)
    assert out.returncode == 1 and "does not have model 'nope'" in out.stderr and "scripted" in out.stderr
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    out = run_cli("bench", "compare", str(bad), str(bad))
    assert out.returncode == 2 and "not valid JSON" in out.stderr
