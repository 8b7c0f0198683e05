"""`localinfer bench serve`: a load generator for any OpenAI-compatible endpoint, measured from
the client side by the seeds' definitions.

Each request streams; every chunk is timed on arrival. TTFT: request sent -> first content.
ITL: the gaps between content chunks. TPOT: (end - first content) / (tokens - 1). E2E:
sent -> last byte. Throughput counts the requests that succeeded (and their tokens) over the
load level's wall time; goodput, those that also met the SLO. Loads are closed (a fixed
number of requests in flight) or open (Poisson arrivals at a rate); the seed fixes the
prompts and the arrival times, so two runs send the same requests at the same moments.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from localinfer.errors import UserError

PROMPTS_FILE = Path(__file__).with_name("chat_prompts.txt")
WORDS = (
    "the river light stone garden winter market engine paper window quiet bridge orange forest signal number music "
    "harbor copper lantern meadow silver thunder valley pocket ribbon canvas marble shadow candle feather planet"
).split()


@dataclass
class RequestSpec:
    messages: list[dict]
    max_tokens: int


@dataclass
class RequestRecord:
    """One request as the client saw it; times in seconds from the level's start."""

    sent: float
    max_tokens: int = 0  # asked for
    ok: bool = False
    error: str = ""
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int | None = None

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.tokens - 1)


# --- workloads -------------------------------------------------------------------------------
def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def workload(name: str, n: int, seed: int, input_len: int, output_len: int) -> list[RequestSpec]:
    """The n requests of a workload, the same for the same seed.
    synthetic: prompts of input_len ± 25 % words, output_len ± 25 % tokens;
    chat: the shipped prompts (chat_prompts.txt, written for this project), output_len tokens;
    shared-prefix: one long system prompt (~8 x input_len words) and a short question each;
    long-prompt: synthetic, but every 8th request carries a prompt 8 x as long (chunked prefill)."""
    rng = random.Random(seed)
    jitter = lambda x: max(1, round(x * rng.uniform(0.75, 1.25)))  # noqa: E731
    if name == "synthetic":
        return [RequestSpec([{"role": "user", "content": words(rng, jitter(input_len))}], jitter(output_len)) for _ in range(n)]
    if name == "chat":
        prompts = [line.strip() for line in PROMPTS_FILE.read_text(encoding="utf-8").splitlines() if line.strip() and not line.startswith("#")]
        return [RequestSpec([{"role": "user", "content": rng.choice(prompts)}], output_len) for _ in range(n)]
    if name == "shared-prefix":
        system = "You answer questions about this document.\n\n" + words(rng, 8 * input_len)
        return [RequestSpec([{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: {words(rng, 8)}?"}], output_len) for i in range(n)]
    if name == "long-prompt":
        return [RequestSpec([{"role": "user", "content": words(rng, jitter(input_len) * (8 if i % 8 == 4 else 1))}], jitter(output_len)) for i in range(n)]
    raise UserError(f"'{name}' is not a workload: synthetic, chat, shared-prefix, long-prompt")


WORKLOADS = ("synthetic", "chat", "shared-prefix", "long-prompt")


# --- one request ------------------------------------------------------------------------------
async def send(client: httpx.AsyncClient, url: str, model: str | None, spec: RequestSpec, t0: float, timeout: float, extra: dict) -> RequestRecord:
    body = {"messages": spec.messages, "max_tokens": spec.max_tokens, "stream": True, "stream_options": {"include_usage": True}, "temperature": 0, **extra}
    if model:
        body["model"] = model
    record = RequestRecord(sent=time.perf_counter() - t0, max_tokens=spec.max_tokens)
    start = time.perf_counter()
    last = None
    chunks = 0
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode("utf-8", "replace")
                    try:
                        text = json.loads(text)["error"]["message"]
                    except (ValueError, KeyError, TypeError):
                        pass
                    record.error = f"HTTP {r.status_code}: {str(text)[:200]}"
                    return record
                done = False
                async for line in r.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        record.error = f"stream error: {chunk['error'].get('message', chunk['error'])}"
                        return record
                    now = time.perf_counter()
                    if chunk.get("usage"):
                        record.tokens = int(chunk["usage"].get("completion_tokens") or 0)
                        record.prompt_tokens = chunk["usage"].get("prompt_tokens")
                    for choice in chunk.get("choices") or []:
                        if (choice.get("delta") or {}).get("content"):
                            chunks += 1
                            if last is None:
                                record.ttft = now - start
                            else:
                                record.itl.append(now - last)
                            last = now
                if not done:
                    record.error = "the stream ended without [DONE]"
                    return record
        record.e2e = time.perf_counter() - start
        record.tokens = record.tokens or chunks
        record.ok = record.ttft is not None
        if not record.ok:
            record.error = "no content in the answer"
    except TimeoutError:
        record.error = f"timed out after {timeout:g} s"
    except (httpx.HTTPError, json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError, ValueError) as e:
        record.error = f"{type(e).__name__}: {str(e)[:200] or 'malformed stream'}"
    return record


# --- a load level -------------------------------------------------------------------------------
@dataclass
class Level:
    """One load: closed (`concurrency`) or open (`rate` requests/s)."""

    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        return f"concurrency {self.concurrency}" if self.concurrency else f"rate {self.rate:g}/s"


async def run_level(url: str, model: str | None, level: Level, specs: list[RequestSpec], seed: int, timeout: float, extra: dict, on_done: Callable[[RequestRecord], None] | None = None) -> tuple[list[RequestRecord], float]:
    """Send every spec under this load; (records, wall seconds). Cancelling keeps what finished."""
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=max(level.concurrency or 0, 64), max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10), limits=limits) as client:
        t0 = time.perf_counter()

        async def one(spec: RequestSpec) -> None:
            record = await send(client, url, model, spec, t0, timeout, extra)
            records.append(record)
            if on_done:
                on_done(record)

        try:
            if level.concurrency:
                queue = list(reversed(specs))

                async def worker() -> None:
                    while queue:
                        await one(queue.pop())

                await asyncio.gather(*(worker() for _ in range(level.concurrency)))
            else:
                tasks = []
                for spec, at in zip(specs, arrival_times(len(specs), level.rate, seed)):  # type: ignore[arg-type]
                    await asyncio.sleep(max(0.0, at - (time.perf_counter() - t0)))
                    tasks.append(asyncio.create_task(one(spec)))
                await asyncio.gather(*tasks)
        finally:
            wall = time.perf_counter() - t0
    return records, wall


def arrival_times(n: int, rate: float, seed: int) -> list[float]:
    """When each of n requests is sent under an open loop: a Poisson process at `rate` per
    second (exponential gaps), the same for the same seed."""
    rng, at, times = random.Random(seed), 0.0, []
    for _ in range(n):
        at += rng.expovariate(rate)
        times.append(at)
    return times


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    s = sorted(values)
    pick = lambda q: s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]  # noqa: E731
    return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "mean": sum(s) / len(s)}


def summarize(records: list[RequestRecord], wall: float, slo_ttft: float | None, slo_tpot: float | None) -> dict[str, object]:
    """The seeds' metrics for one level (seconds; per second)."""
    ok = [r for r in records if r.ok]

    def meets(r: RequestRecord) -> bool:
        return (slo_ttft is None or (r.ttft or 0) <= slo_ttft) and (slo_tpot is None or r.tpot is None or r.tpot <= slo_tpot)

    good = [r for r in ok if meets(r)]
    tokens = sum(r.tokens for r in ok)
    return {
        "requests": len(records),
        "ok": len(ok),
        "failed": len(records) - len(ok),
        "errors": sorted({r.error for r in records if r.error})[:5],
        "wall_s": wall,
        "ttft_s": percentiles([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": percentiles([r.tpot for r in ok if r.tpot is not None]),
        "itl_s": percentiles([x for r in ok for x in r.itl]),
        "e2e_s": percentiles([r.e2e for r in ok if r.e2e is not None]),
        "request_throughput": len(ok) / wall if wall else 0.0,
        "output_throughput": tokens / wall if wall else 0.0,
        "goodput": len(good) / wall if wall else 0.0,
    }


def check_server(url: str, model: str | None, timeout: float = 10) -> list[str]:
    """The models the endpoint lists; a one-line UserError if it cannot be reached or lacks `model`."""
    try:
        r = httpx.get(url + "/v1/models", timeout=timeout)
    except httpx.HTTPError as e:
        raise UserError(f"cannot reach {url}: {type(e).__name__}: {e}") from None
    if r.status_code != 200:
        raise UserError(f"{url}/v1/models answered {r.status_code}; is this an OpenAI-compatible endpoint?")
    try:
        names = [m["id"] for m in r.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{url}/v1/models did not answer with OpenAI's model list") from None
    if model is not None and names and model not in names:
        raise UserError(f"{url} does not have model '{model}' (it lists: {', '.join(names[:8])})")
    return names


def record_dict(r: RequestRecord) -> dict[str, object]:
    return {**asdict(r), "tpot": r.tpot}
