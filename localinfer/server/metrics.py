"""Prometheus metrics, in the seeds' vocabulary: TTFT, TPOT, ITL and end-to-end latency
as histograms; tokens and requests as counters; the scheduler's state as gauges. Prefix-cache
hits are a counter (rate() of it over that of prompt tokens is the hit rate): a gauge of a
running count would lose what happened between two scrapes."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from localinfer.engine.prompt_cache import PromptCache

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self, running: Callable[[], float], waiting: Callable[[], float], slots_free: Callable[[], float],
                 cells_used: Callable[[], float], cells_free: Callable[[], float], cells_cached: Callable[[], float],
                 prompt_caches: Callable[[], list[PromptCache]] = list) -> None:  # fmt: skip
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("localinfer_time_to_first_token_seconds", "Submit to first token (queue + prefill + first sample)", registry=r, buckets=LATENCY_BUCKETS)
        self.tpot = Histogram("localinfer_time_per_output_token_seconds", "Mean time per output token after the first, per request", registry=r, buckets=LATENCY_BUCKETS)
        self.itl = Histogram("localinfer_inter_token_latency_seconds", "Time between consecutive tokens of a stream", registry=r, buckets=LATENCY_BUCKETS)
        self.e2e = Histogram("localinfer_e2e_request_latency_seconds", "Request received to last token", registry=r, buckets=LATENCY_BUCKETS)
        self.prompt_tokens = Counter("localinfer_prompt_tokens", "Prompt tokens received", registry=r)
        self.generation_tokens = Counter("localinfer_generation_tokens", "Tokens generated", registry=r)
        self.prefix_hit_tokens = Counter("localinfer_prefix_cache_hit_tokens", "Prompt tokens found in the KV cache and not prefilled", registry=r)
        self.drafted = Counter("localinfer_draft_tokens", "Tokens drafted for speculative decoding, by source (model: a draft model; lookup: prompt lookup)", ["source"], registry=r)
        self.accepted = Counter("localinfer_draft_accepted_tokens", "Drafted tokens the model kept, by source (acceptance rate: this over drafted)", ["source"], registry=r)
        self.tokens_per_forward = Histogram("localinfer_tokens_per_forward", "Tokens a request got per target forward while decoding (1 without speculation)", registry=r,
                                            buckets=(1, 1.25, 1.5, 2, 3, 4, 6, 8, 12))  # fmt: skip
        self.requests = Counter("localinfer_requests", "Requests by route and final status", ["route", "status"], registry=r)
        Gauge("localinfer_requests_running", "Requests holding a slot", registry=r).set_function(running)
        Gauge("localinfer_requests_waiting", "Requests queued for a slot", registry=r).set_function(waiting)
        Gauge("localinfer_kv_cache_slots_free", "KV-cache sequences no request holds", registry=r).set_function(slots_free)
        Gauge("localinfer_kv_cache_cells_used", "KV-cache cells holding tokens (running requests and prefixes kept for reuse)", registry=r).set_function(cells_used)
        Gauge("localinfer_kv_cache_cells_free", "KV-cache cells holding nothing", registry=r).set_function(cells_free)
        self.kv_bytes = Gauge("localinfer_kv_cache_bytes_used", "Bytes the KV cells in use hold, by model and K/V type", ["model", "type_k", "type_v"], registry=r)
        Gauge("localinfer_prefix_cache_tokens", "Tokens that free slots keep for prefix reuse", registry=r).set_function(cells_cached)
        r.register(PromptCacheCollector(prompt_caches))


class PromptCacheCollector:
    """The prompt caches' counts, read at each scrape from the caches themselves (their
    counters live with them, so a model swapped out takes its counts along)."""

    def __init__(self, caches: Callable[[], list[PromptCache]]) -> None:
        self.caches = caches

    def collect(self):  # type: ignore[no-untyped-def]  # prometheus_client's collector protocol
        caches = self.caches()
        hits = CounterMetricFamily("localinfer_prompt_cache_hits", "KV blocks put back from the prompt cache instead of computed, by tier", labels=["tier"])
        for tier in ("ram", "disk"):
            hits.add_metric([tier], sum(c.stats.hits[tier] for c in caches))
        size = GaugeMetricFamily("localinfer_prompt_cache_bytes", "Bytes the prompt cache holds, by tier", labels=["tier"])
        size.add_metric(["ram"], sum(c.ram_bytes for c in caches))
        size.add_metric(["disk"], sum(c.disk.stats.bytes for c in caches if c.disk is not None))
        evictions = CounterMetricFamily("localinfer_prompt_cache_evictions", "KV blocks dropped from a tier to keep it in its budget", labels=["tier"])
        evictions.add_metric(["ram"], sum(c.stats.ram_evictions for c in caches))
        evictions.add_metric(["disk"], sum(c.disk.stats.evictions for c in caches if c.disk is not None))
        yield hits
        yield CounterMetricFamily("localinfer_prompt_cache_misses", "KV blocks looked for in the prompt cache and not found", value=sum(c.stats.misses for c in caches))
        yield CounterMetricFamily("localinfer_prompt_cache_stored", "KV blocks given to the prompt cache", value=sum(c.stats.stored for c in caches))
        yield CounterMetricFamily("localinfer_prompt_cache_corrupt", "Block files found damaged or not their model's, and deleted",
                                  value=sum(c.disk.stats.corrupt for c in caches if c.disk is not None))  # fmt: skip
        yield size
        yield evictions
