"""`localinfer serve` under load, measured from the client side, in one run; ratios, not
absolute numbers, since these machines are shared.

  concurrency  aggregate decode tokens/s with 4 concurrent greedy streams against 1 (each
               stream's tokens after its first, over the span from the first first-token to
               the last token), for localinfer on llama.cpp and native with --draft none
               (batching alone), on llama.cpp with speculation on (the default), and
               llama-cpp-python's own server (`llama_cpp.server`) as the anchor.
  itl          the inter-token latency of 3 running streams while a 2,000-token prompt
               arrives, p99 against the median and against the streams' ITL before it
               arrived, for several --prefill-chunk sizes (4096: the whole prompt in one
               step, i.e. no chunking), with fixed chunks (--decode-slowdown 0) and with
               the default time budget (2).
  prefix       the TTFT of turn 2 of a chat with a ~1,500-token history: on the server that
               answered turn 1 (its cache holds the history) against a fresh server (none).

The anchor needs two packages that localinfer does not: `pip install starlette-context
pydantic-settings` into the environment that runs this (it is skipped, and said so, without).
It serves one request at a time; run with `--interrupt_requests False`, so that a new request
waits instead of cutting the running stream off (its default), it gets the same load.

    .venv/bin/python bench/serve.py [--threads 2] [--tokens 96] [--rounds 3] [--json] [--skip anchor,native,concurrency,itl,prefix]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Write a long story about a dragon.", "Write a long story about a lighthouse keeper.",
           "Write a long story about a lost robot.", "Write a long story about a garden."]  # fmt: skip
TEXT = (ROOT / "tests" / "data" / "alice_in_wonderland.txt").read_text()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, command: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server must never block on an unread pipe
        self.proc = subprocess.Popen([*command, "--port", str(self.port)], stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(self.log.read().decode(errors="replace")[-2000:])
            try:
                if httpx.get(self.url + "/v1/models", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError("server did not start")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()


def localinfer(*args: str) -> list[str]:
    return [sys.executable, "-m", "localinfer", "serve", *args]


def stream(url: str, messages: list[dict], max_tokens: int, times: list[float] | None = None) -> dict:
    """One greedy streamed chat request: token arrival times and the usage."""
    body = {"model": "smollm2:135m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "repeat_penalty": 1.0}  # fmt: skip
    arrivals, usage, t0 = [], None, time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
    if times is not None:
        times.extend(arrivals)
    return {"start": t0, "arrivals": arrivals, "usage": usage, "ttft": arrivals[0] - t0 if arrivals else float("nan")}


def aggregate_decode(results: list[dict]) -> float:
    first = min(r["arrivals"][0] for r in results)
    last = max(r["arrivals"][-1] for r in results)
    return sum(len(r["arrivals"]) - 1 for r in results) / (last - first)


def concurrent(url: str, n: int, tokens: int) -> float:
    results: list[dict] = [None] * n  # type: ignore[list-item]

    def run(i: int) -> None:
        results[i] = stream(url, [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return aggregate_decode(results)


def bench_concurrency(name: str, command: list[str], tokens: int, rounds: int) -> dict:
    server = Server(command)
    try:
        stream(server.url, [{"role": "user", "content": "Hi"}], 8)  # warm-up
        one, four = [], []
        for _ in range(rounds):
            one.append(concurrent(server.url, 1, tokens))
            four.append(concurrent(server.url, 4, tokens))
    finally:
        server.close()
    r = {"1 stream tok/s": statistics.median(one), "4 streams tok/s": statistics.median(four)}
    r["ratio"] = r["4 streams tok/s"] / r["1 stream tok/s"]
    print(f"  {name:32} 1 stream {r['1 stream tok/s']:7.1f} tok/s | 4 streams {r['4 streams tok/s']:7.1f} tok/s | ratio {r['ratio']:.2f}x", flush=True)
    return r


def long_prompt(n_tokens: int) -> str:
    return "Summarise this passage in one sentence:\n\n" + TEXT[: int(n_tokens * 3.7)]


def bench_itl(threads: int, chunk: int, slowdown: float) -> dict:
    server = Server(localinfer("--threads", str(threads), "--parallel", "4", "--ctx", "2600", "--prefill-chunk", str(chunk), "--decode-slowdown", str(slowdown)))
    try:
        stream(server.url, [{"role": "user", "content": "Hi"}], 8)
        times: list[list[float]] = [[], [], []]
        runners = [threading.Thread(target=stream, args=(server.url, [{"role": "user", "content": PROMPTS[i]}], 300, times[i])) for i in range(3)]
        for t in runners:
            t.start()
        time.sleep(1.0)  # the three are decoding
        long = stream(server.url, [{"role": "user", "content": long_prompt(2000)}], 1)
        for t in runners:
            t.join()
    finally:
        server.close()
    pairs = [(a, b) for ts in times for a, b in zip(ts, ts[1:])]
    gaps = sorted(b - a for a, b in pairs)
    alone = statistics.median(b - a for a, b in pairs if b < long["start"])  # before the long prompt arrived
    p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
    med = statistics.median(gaps)
    r = {"prefill_chunk": chunk, "decode_slowdown": slowdown, "median_itl_ms": med * 1e3, "p99_itl_ms": p99 * 1e3, "max_itl_ms": gaps[-1] * 1e3,
         "p99_over_median": p99 / med, "itl_alone_ms": alone * 1e3, "p99_over_alone": p99 / alone,
         "long_prompt_tokens": long["usage"]["prompt_tokens"], "long_prompt_ttft_ms": long["ttft"] * 1e3}  # fmt: skip
    print(f"  --prefill-chunk {chunk:5} --decode-slowdown {slowdown:3}  median ITL {r['median_itl_ms']:6.1f} ms | p99 {r['p99_itl_ms']:7.1f} ms | max {r['max_itl_ms']:7.1f} ms"
          f" | p99/median {r['p99_over_median']:5.2f} | alone {r['itl_alone_ms']:5.1f} ms, p99/alone {r['p99_over_alone']:5.2f}"
          f" | long prompt {r['long_prompt_tokens']} tokens, TTFT {r['long_prompt_ttft_ms']:.0f} ms", flush=True)  # fmt: skip
    return r


def bench_prefix(threads: int) -> dict:
    history = [{"role": "user", "content": long_prompt(1400)}]
    command = localinfer("--threads", str(threads), "--parallel", "2", "--ctx", "2600")
    warm = Server(command)
    try:
        reply = httpx.post(warm.url + "/v1/chat/completions", json={"messages": history, "max_tokens": 48, "temperature": 0, "repeat_penalty": 1.0}, timeout=600).json()
        answer = reply["choices"][0]["message"]["content"]
        turn2 = history + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Now say it in five words."}]
        reused = stream(warm.url, turn2, 8)
    finally:
        warm.close()
    cold = Server(command)
    try:
        stream(cold.url, [{"role": "user", "content": "Hi"}], 4)  # loaded and warm, but its cache has no history
        fresh = stream(cold.url, turn2, 8)
    finally:
        cold.close()
    r = {"history_tokens": reused["usage"]["prompt_tokens"], "cached_tokens": reused["usage"]["prompt_tokens_details"]["cached_tokens"],
         "ttft_reused_ms": reused["ttft"] * 1e3, "ttft_fresh_ms": fresh["ttft"] * 1e3}  # fmt: skip
    r["ratio"] = r["ttft_fresh_ms"] / r["ttft_reused_ms"]
    print(f"  turn 2 of {r['history_tokens']} tokens ({r['cached_tokens']} cached): TTFT {r['ttft_reused_ms']:.0f} ms reused vs {r['ttft_fresh_ms']:.0f} ms fresh: {r['ratio']:.1f}x lower", flush=True)
    return r


def bench_all_concurrency(threads: int, tokens: int, rounds: int, skip: set[str]) -> dict:
    results = {}
    print(f"concurrency: aggregate decode tokens/s, {tokens} tokens per stream, median of {rounds}", flush=True)
    # Batching alone (--draft none), as issue 10 measures it; speculation (issue 11) shown beside it.
    contenders = {"localinfer serve (llama.cpp)": localinfer("--threads", str(threads), "--parallel", "4", "--draft", "none")}
    if "native" not in skip:
        contenders["localinfer serve (native)"] = localinfer("--threads", str(threads), "--parallel", "4", "--engine", "native", "--draft", "none")
    contenders["localinfer serve (llama.cpp, speculation on)"] = localinfer("--threads", str(threads), "--parallel", "4")
    if "anchor" not in skip:
        try:
            import llama_cpp.server.app  # noqa: F401

            from localinfer.store.pull import local_path
            from localinfer.store.refs import resolve

            contenders["llama_cpp.server (anchor)"] = [sys.executable, "-m", "llama_cpp.server", "--model", str(local_path(resolve(None))),
                                                       "--model_alias", "smollm2:135m", "--n_threads", str(threads), "--n_ctx", "4096",
                                                       "--interrupt_requests", "False"]  # fmt: skip  (by default a new request cuts the running stream off)
        except ImportError as e:
            print(f"  llama_cpp.server skipped: {e} (pip install starlette-context pydantic-settings)")
    for name, command in contenders.items():
        results[name] = bench_concurrency(name, command, tokens, rounds)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunks", default="4096:0,512:0,16:0,512:2", help="--prefill-chunk:--decode-slowdown pairs")
    ap.add_argument("--skip", default="", help="comma-separated: concurrency, itl, prefix, native, anchor")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    skip = set(args.skip.split(",")) - {""}
    results: dict[str, object] = {}
    if "concurrency" not in skip:
        results["concurrency"] = bench_all_concurrency(args.threads, args.tokens, args.rounds, skip)
    if "itl" not in skip:
        print("itl: 3 running streams while a 2,000-token prompt arrives (localinfer, llama.cpp engine)", flush=True)
        results["itl"] = [bench_itl(args.threads, int(c), float(f)) for c, f in (pair.split(":") for pair in args.chunks.split(","))]
    if "prefix" not in skip:
        print("prefix: TTFT of turn 2 of a chat", flush=True)
        results["prefix"] = bench_prefix(args.threads)
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
