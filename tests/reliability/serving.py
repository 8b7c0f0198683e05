"""The server's reliability scenarios, written once: the tests run them small, and
bench/reliability.py runs them at the issue's sizes. Each drives a real `localinfer serve`
on loopback with httpx, and returns a report (a dict) whose `problems` list is empty when
every promise held."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import psutil

from localinfer.benchmark.serve import WORDS
from localinfer.benchmark.serve import words as some_words

from ..conftest import parse_metrics

# One client for every thread: a new httpx.Client per request builds an SSL context (~10 ms
# of CPU), and 100 of them at once delayed the requests by seconds on 2 cores.
CLIENT = httpx.Client(limits=httpx.Limits(max_connections=512, max_keepalive_connections=64))



def distinct_prompts(n: int, seed: int = 0) -> list[str]:
    """n different questions, so that a token in the wrong stream shows."""
    rng = random.Random(seed)
    return [f"Question {i}: write one sentence about a {rng.choice(WORDS)} and a {rng.choice(WORDS)} in {rng.choice(WORDS)} light." for i in range(n)]


def long_prompt(words: int, seed: int) -> str:
    """A prompt whose prefill takes a while and shares no prefix with another seed's."""
    rng = random.Random(seed)
    return f"{seed} " + some_words(rng, words) + "\nSummarize the list above."


@dataclass
class Answer:
    status: int
    text: str = ""
    finish: str | None = None
    retry_after: str | None = None
    seconds_to_status: float = 0.0
    error: str | None = None


def chat_body(prompt: str, max_tokens: int, stream: bool) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0, "stream": stream}


def stream_chat(url: str, prompt: str, max_tokens: int, timeout: float = 120.0) -> Answer:
    """One streamed greedy chat completion, read to its end."""
    import json

    started = time.monotonic()
    try:
        with CLIENT.stream("POST", url + "/v1/chat/completions", json=chat_body(prompt, max_tokens, True), timeout=timeout) as r:
            answer = Answer(r.status_code, seconds_to_status=time.monotonic() - started, retry_after=r.headers.get("retry-after"))
            if r.status_code != 200:
                r.read()
                answer.error = r.text[:200]
                return answer
            parts = []
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    answer.error = str(chunk["error"])[:200]
                for choice in chunk.get("choices", []):
                    parts.append(choice["delta"].get("content") or "")
                    answer.finish = choice.get("finish_reason") or answer.finish
            answer.text = "".join(parts)
            return answer
    except httpx.HTTPError as e:
        return Answer(0, error=f"{type(e).__name__}: {e}", seconds_to_status=time.monotonic() - started)


def references(url: str, prompts: list[str], max_tokens: int) -> dict[str, str]:
    """Each prompt's greedy answer from a run alone: what it must be under any load."""
    return {prompt: stream_chat(url, prompt, max_tokens).text for prompt in prompts}


def metrics(url: str) -> dict[str, float]:
    return parse_metrics(CLIENT.get(url + "/metrics", timeout=10).text)


def settle(url: str, parallel: int, timeout: float = 60.0) -> tuple[dict[str, float], list[str]]:
    """Wait until nothing runs or waits; then every slot must be free and every KV cell
    either free or a free slot's prefix kept for reuse (none held by a request)."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        if (m["localinfer_requests_running"] == 0 and m["localinfer_requests_waiting"] == 0) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    problems = []
    if m["localinfer_requests_running"] or m["localinfer_requests_waiting"]:
        problems.append(f"still {m['localinfer_requests_running']:g} running and {m['localinfer_requests_waiting']:g} waiting after {timeout:g} s")
    if m["localinfer_kv_cache_slots_free"] != parallel:
        problems.append(f"{m['localinfer_kv_cache_slots_free']:g} of {parallel} slots free")
    if m["localinfer_kv_cache_cells_used"] != m["localinfer_prefix_cache_tokens"]:
        problems.append(f"{m['localinfer_kv_cache_cells_used'] - m['localinfer_prefix_cache_tokens']:g} KV cells held by no free slot's prefix")
    return m, problems


def healthy(url: str, prompt: str, expected: str, max_tokens: int) -> list[str]:
    problems = []
    if CLIENT.get(url + "/health", timeout=10).status_code != 200:
        problems.append("/health is not 200")
    again = stream_chat(url, prompt, max_tokens)
    if again.status != 200 or again.text != expected:
        problems.append(f"a fresh greedy answer changed: {again.text[:80]!r} != {expected[:80]!r}")
    return problems


def concurrently(fns: list[Callable[[], object]]) -> list[object]:
    """Run every function on its own thread, released together; their results in order."""
    results: list[object] = [None] * len(fns)
    gate = threading.Barrier(len(fns))

    def run(i: int) -> None:
        gate.wait()
        results[i] = fns[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# --- 3. load ----------------------------------------------------------------------------------


def common_words(a: str, b: str) -> int:
    """How many words two texts start with alike (words, not characters: many answers of
    random weights start with a space, which says nothing about where they came from)."""
    n = 0
    for x, y in zip(a.split(), b.split()):
        if x != y:
            break
        n += 1
    return n


def is_its_own(text: str, prompt: str, refs: dict[str, str], exact: bool) -> bool:
    """Whether a streamed answer is its prompt's greedy answer. Where the kernels round by the
    batch they run in (a GPU: `exact` False), the answer may part from the reference anywhere,
    at the first token where the top two logits are close (random weights), but another
    stream's tokens still show: the answer may not start with more words of another prompt's
    reference than of its own, and it is empty only if the reference is."""
    own = refs[prompt]
    if exact or text == own:
        return text == own
    others = [common_words(text, r) for p, r in refs.items() if p != prompt and r != own]
    return bool(text) == bool(own) and common_words(text, own) >= max(others, default=0)


def load(url: str, parallel: int, clients: int = 100, n_prompts: int = 20, max_tokens: int = 24, immediate: float = 1.0,
         exact: bool = True) -> dict[str, object]:  # fmt: skip
    """`clients` streaming clients at once. Each ends complete with its prompt's own greedy
    answer (is_its_own), or with a 503 and Retry-After within `immediate` seconds."""
    prompts = distinct_prompts(n_prompts)
    refs = references(url, prompts, max_tokens)
    started = time.monotonic()
    answers: list[Answer] = concurrently([lambda i=i: stream_chat(url, prompts[i % n_prompts], max_tokens) for i in range(clients)])  # type: ignore[assignment]
    seconds = time.monotonic() - started
    problems = []
    complete = refused = 0
    for i, a in enumerate(answers):
        prompt = prompts[i % n_prompts]
        if a.status == 200 and a.error is None and a.finish in ("stop", "length"):
            complete += 1
            if not is_its_own(a.text, prompt, refs, exact):
                problems.append(f"client {i}: its answer differs from the prompt's own: {a.text[:60]!r} vs {refs[prompt][:60]!r}")
        elif a.status == 503:
            refused += 1
            if a.retry_after is None or a.seconds_to_status > immediate:
                problems.append(f"client {i}: a 503 after {a.seconds_to_status:.2f} s, Retry-After {a.retry_after!r}")
        else:
            problems.append(f"client {i}: status {a.status}, finish {a.finish}, error {a.error}")
    m, settled = settle(url, parallel)
    problems += settled + healthy(url, prompts[0], refs[prompts[0]], max_tokens)
    slowest_503 = max((a.seconds_to_status for a in answers if a.status == 503), default=0.0)
    return {"clients": clients, "complete": complete, "refused_503": refused, "seconds": round(seconds, 1),
            "slowest_503_s": round(slowest_503, 3), "problems": problems}  # fmt: skip


# --- 4. disconnects ----------------------------------------------------------------------------


def drop_after(url: str, body: dict[str, object], chunks: int) -> int:
    """Open a streamed request and leave after `chunks` content chunks; how many came."""
    seen = 0
    with CLIENT.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            seen += is_content(line.encode())
            if seen >= chunks:
                break
    return seen


def is_content(data: bytes) -> int:
    """How many streamed chunks in `data` carry text (not the role chunk's empty content)."""
    return sum(1 for line in data.split(b"\n") if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line)


def drop_at(url: str, body: dict[str, object], seconds: float) -> int:
    """Send a streamed request on a raw socket and close it after `seconds`, whatever has
    come (httpx reads only when a line arrives, and in a prefill nothing does); the number
    of content chunks that came before."""
    import json
    import socket
    from urllib.parse import urlparse

    where = urlparse(url)
    payload = json.dumps(body).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    got = b""
    with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
        sock.sendall(head.encode() + payload)
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                break
            got += data
    return is_content(got)


def drop_non_streamed(url: str, body: dict[str, object], seconds: float) -> bool:
    """A non-streamed request whose client times out: True if it did time out."""
    try:
        CLIENT.post(url + "/v1/chat/completions", json=body, timeout=seconds)
    except httpx.TimeoutException:
        return True
    return False


def disconnects(url: str, parallel: int, rounds: int = 200, max_tokens: int = 24) -> dict[str, object]:
    """Each round: a stream left mid-decode and one left mid-prefill hold the slots (with
    --parallel 2), a third request leaves while queued behind them, and a non-streamed one
    times out. Afterwards every slot and KV cell is free and greedy answers are unchanged."""
    prompt = distinct_prompts(1, seed=99)[0]
    expected = references(url, [prompt], max_tokens)[prompt]
    before = metrics(url).get('localinfer_requests_total{status="disconnected"}', 0)
    counts = {"mid_decode": 0, "mid_prefill": 0, "queued": 0, "non_streamed": 0}
    problems = []
    for r in range(rounds):
        story = chat_body(f"Round {r}: write a very long story about a lighthouse.", 400, True)
        prefill = chat_body(long_prompt(1200, seed=r), 400, True)
        queued_seen: list[bool] = []

        def queued() -> int:
            time.sleep(0.15)  # after the other two hold both slots
            with CLIENT.stream("POST", url + "/v1/chat/completions", json=chat_body(f"Round {r}: count to fifty.", 400, True), timeout=60):
                deadline = time.monotonic() + 2
                while time.monotonic() < deadline:
                    if metrics(url)["localinfer_requests_waiting"] >= 1:
                        queued_seen.append(True)
                        break
                    time.sleep(0.02)
            return 0

        decode_seen, prefill_seen, _, timed_out = concurrently([
            lambda: drop_after(url, story, chunks=3),
            lambda: drop_at(url, prefill, 0.15),
            queued,
            lambda: drop_non_streamed(url, {**chat_body(f"Round {r}: list every prime below 500.", 400, False), "ignore_eos": True}, 0.3),  # 400 tokens: never done in 0.3 s
        ])  # fmt: skip
        counts["mid_decode"] += decode_seen == 3
        counts["mid_prefill"] += prefill_seen == 0
        counts["queued"] += bool(queued_seen)
        counts["non_streamed"] += bool(timed_out)
    m, settled = settle(url, parallel)
    problems += settled
    dropped = m.get('localinfer_requests_total{status="disconnected"}', 0) - before
    if dropped < 3 * rounds:
        problems.append(f"only {dropped:g} requests counted as disconnected for {4 * rounds} dropped")
    problems += healthy(url, prompt, expected, max_tokens)
    return {"rounds": rounds, "dropped": counts, "counted_disconnected": int(dropped), "problems": problems}


# --- 5. soak -----------------------------------------------------------------------------------


def soak(url: str, pid: int, parallel: int, sequential: int = 1000, concurrent: int = 1000, clients: int = 16, warmup: int = 100,
         max_tokens: int = 8, every: int = 50) -> dict[str, object]:  # fmt: skip
    """`warmup` requests, then `sequential` one after another and `concurrent` more from
    `clients` threads. RSS is sampled every `every` requests; RSS and open fds are compared
    at two quiet moments: after the warm-up, and after everything."""
    proc = psutil.Process(pid)
    prompts = distinct_prompts(64, seed=7)
    samples: list[dict[str, float]] = []
    done = 0
    lock = threading.Lock()
    failures: list[str] = []

    def one(i: int) -> None:
        nonlocal done
        a = stream_chat(url, prompts[i % len(prompts)], max_tokens)
        with lock:
            if a.status != 200 or a.error:
                failures.append(f"request {i}: {a.status} {a.error}")
            done += 1
            if done % every == 0:
                samples.append({"requests": done, "rss_mib": round(proc.memory_info().rss / 2**20, 1), "fds": proc.num_fds()})

    def quiet() -> tuple[float, int]:
        settle(url, parallel)
        time.sleep(0.5)  # the server closes its side of the last connections
        return proc.memory_info().rss / 2**20, proc.num_fds()

    def many(first: int, n: int) -> None:
        queue = iter(range(first, first + n))
        take = threading.Lock()

        def client() -> None:
            while True:
                with take:
                    i = next(queue, None)
                if i is None:
                    return
                one(i)

        concurrently([client] * clients)

    for i in range(warmup // 2):  # the warm-up has both shapes of traffic
        one(i)
    many(warmup // 2, warmup - warmup // 2)
    rss_warm, fds_warm = quiet()
    for i in range(warmup, warmup + sequential):
        one(i)
    many(warmup + sequential, concurrent)
    rss_end, fds_end = quiet()
    _, problems = settle(url, parallel)
    growth = (rss_end - rss_warm) / rss_warm
    if growth >= 0.05:
        problems.append(f"RSS grew {100 * growth:.1f} % after warm-up ({rss_warm:.0f} -> {rss_end:.0f} MiB)")
    if fds_end > fds_warm:
        problems.append(f"open file descriptors grew from {fds_warm} to {fds_end}")
    problems += failures[:5]
    return {"requests": done, "rss_mib": [round(rss_warm, 1), round(rss_end, 1)], "rss_growth_pct": round(100 * growth, 2),
            "fds": [fds_warm, fds_end], "curve": samples, "problems": problems}  # fmt: skip
