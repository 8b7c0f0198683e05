"""The KV cache's slots: which sequence ids are free, what each one's cache holds, and where a
new request's prompt is found already computed.

A finished request leaves its cache in its slot. A new request takes the free slot whose
cache shares the longest token prefix with its prompt, cut to that prefix, so only the rest
is prefilled (the second turn of a chat does not recompute the first). If a busy slot holds
a longer prefix (a long system prompt shared by many requests), it is copied with kv_copy
instead. Past that, the prompt cache (prompt_cache.py) puts back the blocks it kept, from RAM
or disk, and is given every whole block a slot computes. A prompt with images reuses a
slot's prefix, or the prompt cache's blocks, up to an image's edge (media.py): a block may end
inside an image, and an image is prefilled whole or not at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localinfer.backends.base import Backend, MediaChunk
from localinfer.engine.media import cells_end, extra_cells, whole
from localinfer.engine.prefix import common_prefix
from localinfer.engine.prompt_cache import PromptCache
from localinfer.engine.request import Request


@dataclass
class _Blocks:
    """What a slot's request has given the prompt cache."""

    keys: list[str] = field(default_factory=list)  # the chained keys of its whole blocks so far
    stored: int = 0  # of those, how many the cache has been given
    tail_stored: bool = False  # the prompt's last, partial block given (or put back) too


class Slots:
    """The engine's KV-cache sequence ids and what each holds (only the owner thread calls in)."""

    def __init__(self, backend: Backend, n: int, prompt_cache: PromptCache | None) -> None:
        self.backend, self.prompt_cache = backend, prompt_cache
        self.free = list(range(n - 1, -1, -1))  # sequence ids no request holds
        self.tokens: list[list[int]] = [[] for _ in range(n)]  # what each slot's cache holds
        self.media: list[dict[int, MediaChunk]] = [{} for _ in range(n)]  # the images among those tokens, by where each starts
        self._blocks = [_Blocks() for _ in range(n)]

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def cells_used(self) -> int:
        """Cells holding tokens: the running requests' and the cached prefixes kept for reuse."""
        return sum(self._cells(s) for s in range(len(self.tokens)))

    @property
    def cells_cached(self) -> int:
        """Cells that free slots keep for prefix reuse (a read from another thread may be a step old)."""
        return sum(self._cells(s) for s in list(self.free))

    def _cells(self, slot: int) -> int:
        """The cells a slot's sequence fills: a cell a position, but for 2-D images (media.extra_cells)."""
        return len(self.tokens[slot]) + extra_cells(self.media[slot], len(self.tokens[slot]))

    def take_emptiest(self) -> int:
        """A free slot for work that keeps nothing (an embedding): the emptiest, least reuse lost. Emptied."""
        slot = min(self.free, key=lambda s: len(self.tokens[s]))
        self.free.remove(slot)
        self.tokens[slot], self.media[slot] = [], {}
        self.backend.kv_clear(slot)
        return slot

    def give_back(self, slot: int, keep_cache: bool = True) -> None:
        """A slot is free again. Its cache stays for prefix reuse unless `keep_cache` is False
        (a failed request: what the cache holds is not known, so it is cleared)."""
        try:
            if not keep_cache:
                self.tokens[slot] = []
                self.backend.kv_clear(slot)
        finally:
            self.free.append(slot)

    def forget(self, slot: int) -> None:
        """Nothing is known of the slot's cache any more (its backend is gone)."""
        self.tokens[slot] = []

    def forget_all(self) -> None:
        """Reuse nothing the slots hold (another engine on the same backend may have written
        them: benchmarks and tests that share one loaded model)."""
        self.tokens = [[] for _ in self.tokens]

    def fed(self, slot: int, tokens: list[int]) -> None:
        """`tokens` are now in the slot's cache, after what it held."""
        self.tokens[slot] += tokens

    def verified(self, slot: int, fed: list[int], start: int, kept: int) -> None:
        """A verify step fed `fed` at `start` and the first `kept` of them stand: the rest (a
        draft's rejected tail) are rolled back."""
        self.tokens[slot] += fed[:kept]
        if kept < len(fed):
            self.backend.kv_truncate(slot, start + kept)

    # --- placing a new request -------------------------------------------------------------
    def place(self, req: Request, running: list[Request]) -> None:
        """Give `req` the free slot whose cache holds most of its prompt (or a running
        request's longer prefix, copied), then the prompt cache's blocks past that; sets its
        slot, n_past and where its cached tokens came from."""
        limit = len(req.prompt) - 1  # at least one token is fed, for the logits of the next
        prefix = {s: whole(req.media, common_prefix(tokens, req.prompt, limit)) for s, tokens in enumerate(self.tokens)}
        slot = max(self.free, key=lambda s: (prefix[s], -len(self.tokens[s])))
        self.free.remove(slot)
        reuse = prefix[slot]
        donor = max((r.seq_id for r in running), key=prefix.__getitem__, default=None)
        shared = prefix[donor] if donor is not None else 0
        if shared > reuse:
            self.backend.kv_clear(slot)
            reuse = self.backend.kv_copy(donor, slot, shared)  # type: ignore[arg-type]
            self.tokens[slot] = req.prompt[:reuse]
        else:
            reuse = self.backend.kv_truncate(slot, reuse)
            del self.tokens[slot][reuse:]
        req.seq_id, req.cached_from = slot, {"slot": reuse} if reuse else {}
        self.media[slot] = req.media  # the images of what it keeps, too: a kept prefix is this prompt's
        self._blocks[slot] = _Blocks()
        if self.prompt_cache is not None and self.prompt_cache.ready:
            reuse = self._restore(req, reuse, limit)
        req.n_past = req.cached_tokens = reuse

    def _restore(self, req: Request, reuse: int, limit: int) -> int:
        """Put back the prompt cache's blocks past what the slot holds: the slot keeps its
        whole blocks, the rest comes from the cache, block by block, while the chain of keys
        holds. Returns the prompt tokens the slot then holds."""
        cache, slot, blocks = self.prompt_cache, req.seq_id, self._blocks[req.seq_id]
        assert cache is not None
        block = cache.block
        blocks.keys = cache.keys(req.prompt[:limit])
        first, found = reuse // block, []
        for key in blocks.keys[first:]:
            if (got := cache.get(key)) is None:
                break
            found.append((key, *got))
        tail = req.prompt[len(blocks.keys) * block : limit]  # after the last whole block: the partial one
        if tail and first + len(found) == len(blocks.keys) and (got := cache.get(key := cache.tail(blocks.keys, tail))) is not None:
            found.append((key, *got))
        if min(limit, (first + len(found)) * block) <= reuse:
            return reuse
        pos = self.backend.kv_truncate(slot, first * block)
        if pos != first * block:  # a cache that cannot resume there (a sliding window let it go)
            self.tokens[slot], req.cached_from = [], {}
            return 0
        start, written = pos, []
        for key, data, tier in found:
            size = min(block, limit - pos)  # the tail's is shorter
            if self.backend.kv_write(slot, pos, data) != cells_end(req.media, pos + size):  # bytes this backend does not take: never offered again
                cache.discard(key)
                self.backend.kv_truncate(slot, pos)
                break
            pos += size
            written.append((tier, size))
        if (edge := whole(req.media, pos)) < pos:  # the blocks ended inside an image: back to its start
            pos = self.backend.kv_truncate(slot, edge)
        req.cached_from = _tally(start, written, pos)
        self.tokens[slot] = req.prompt[:pos]
        blocks.stored, blocks.tail_stored = pos // block, pos == limit
        return pos

    def store_blocks(self, req: Request) -> None:
        """Give the prompt cache the whole blocks the request's slot now holds that it was
        not given yet (prompt and answer alike: the next turn of a chat starts with both)."""
        cache, slot = self.prompt_cache, req.seq_id
        if cache is None or not cache.ready or slot < 0:
            return
        tokens, block, blocks = self.tokens[slot], cache.block, self._blocks[slot]
        whole = len(tokens) // block
        if whole > blocks.stored:
            blocks.keys = cache.keys(tokens[: whole * block], blocks.keys)
            for j in range(blocks.stored, whole):
                if not cache.has(blocks.keys[j]):
                    cache.put(blocks.keys[j], block, self.backend.kv_read(slot, j * block, (j + 1) * block))
            blocks.stored = whole
        limit = len(req.prompt) - 1  # what _restore looks for: the prompt but its last token
        start = limit // block * block
        if not blocks.tail_stored and start < limit <= len(tokens) and blocks.stored >= limit // block:
            keys = blocks.keys[: limit // block]
            cache.put(cache.tail(keys, req.prompt[start:limit]), limit - start, self.backend.kv_read(slot, start, limit))
            blocks.tail_stored = True


def _tally(start: int, written: list[tuple[str, int]], end: int) -> dict[str, int]:
    """Where a restored slot's tokens up to `end` came from: `start` of them from the slot,
    then each block's from its tier (RAM or disk), the last cut at `end`."""
    counts = {"slot": start} if start else {}
    at = start
    for tier, size in written:
        n = min(size, end - at)
        if n <= 0:
            break
        counts[tier] = counts.get(tier, 0) + n
        at += n
    return counts
