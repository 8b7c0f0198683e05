"""The models a server holds: loaded on demand, least recently used swapped out past
`max_loaded`, idle ones unloaded after `keep_alive`. Each loaded model is one Engine
running on its own thread; requests reach it through `Engine.submit`."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field, replace

from localinfer.engine.engine import Engine
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.errors import BackendLost, ModelNotFound, PathNotAllowed, UserError
from localinfer.store.pull import local_path
from localinfer.store.refs import is_path_ref, resolve

log = logging.getLogger("localinfer.server")


@dataclass
class Loaded:
    engine: Engine
    last_used: float = field(default_factory=time.monotonic)
    in_flight: int = 0
    keep_alive: float | None = None  # seconds idle before unloading, as a request asked (Ollama's keep_alive); None: the server's


# The longest keep-alive short of forever: a century (more would overflow the expiry date /api/ps shows).
MAX_KEEP_ALIVE = 100 * 365 * 86400


def seconds(value: str | float) -> float:
    """Seconds from 300, '300', '30s', '5m' or '1h'; a negative number means forever (as
    Ollama's keep_alive). ValueError for anything else, and for more than MAX_KEEP_ALIVE."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        duration = float(value)
    else:
        m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*([smh]?)\s*", str(value))
        if not m:
            raise ValueError(f"'{value}' is not a duration (e.g. 300, 30s, 5m, 1h, or -1 for forever)")
        duration = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if not duration <= MAX_KEEP_ALIVE:  # `not <=` also refuses NaN
        raise ValueError(f"'{value}' is longer than a century: give -1 for forever")
    return duration


class ModelHost:
    def __init__(self, default_ref: str | None, options: LoadOptions, max_loaded: int = 1, keep_alive: float = 300.0, allow_paths: bool = False) -> None:
        self.default_ref = default_ref
        self.allow_paths = allow_paths  # may a request's `model` name any file on this machine?
        self.options = options
        # A model loaded on demand takes serve's --draft MODEL where it can (the same
        # tokenizer); where not, it decodes with prompt lookup and the log says why. Its
        # pooling and projector are its file's: serve's --pooling and --mmproj are the one model's it names.
        self._on_demand = replace(options, draft_optional=True, pooling=None, mmproj=None)
        self.max_loaded = max(1, max_loaded)
        self.keep_alive = keep_alive  # seconds; < 0: forever
        self.models: dict[str, Loaded] = {}
        self.default_name: str | None = None
        self._lock = asyncio.Lock()

    def _load(self, ref: str | None) -> Engine:
        src = resolve(ref)
        if local_path(src) is None:
            raise ModelNotFound(f"model '{ref}' is not downloaded; run 'localinfer pull {ref}' first")
        engine = open_engine(ref, self.options if ref == self.default_ref else self._on_demand)
        for warning in engine.warnings:  # a memory plan's, a draft model it could not use
            log.warning("%s: %s", engine.name, warning)
        engine.start()
        return engine

    async def start(self) -> None:
        """Load the default model (the server is healthy once it is)."""
        engine = await asyncio.to_thread(self._load, self.default_ref)
        self.default_name = engine.name
        self.models[engine.name] = Loaded(engine)

    async def get(self, ref: str | None) -> Loaded:
        """The loaded model for a request's `model` field, loading it if needed."""
        name = self.default_name if not ref else ref
        if ref and not self.allow_paths and ref != self.default_ref and ref not in self.models and is_path_ref(ref):
            raise PathNotAllowed("the request's model names a file on the server; only the server's own models may be asked for (start it with --allow-paths to allow files)")
        async with self._lock:
            loaded = self.models.get(name or "")
            if loaded is not None and loaded.engine.broken and loaded.in_flight == 0:
                loaded = await self._reload(name or "", self.default_ref if name == self.default_name else ref, loaded)
            if loaded is None:
                while len(self.models) >= self.max_loaded and self._evict():
                    pass
                loaded = self._keep(await asyncio.to_thread(self._load, ref), name)
            loaded.last_used = time.monotonic()
            return loaded

    async def _reload(self, key: str, ref: str | None, broken: Loaded) -> Loaded:
        """Load a model that broke (its engine's process lost with an RPC worker) again, once
        no request runs on it. While that fails it stays as it is, so /health still says why,
        and the request gets a 503 that says both."""
        log.warning("%s: %s; loading it again", key, broken.engine.broken)
        try:
            engine = await asyncio.to_thread(self._load, ref)
        except UserError as e:
            raise BackendLost(f"{broken.engine.broken}; loading it again failed: {e}") from None
        self._unload(key)
        if key == self.default_name:
            self.default_name = engine.name
        return self._keep(engine, key)

    def _keep(self, engine: Engine, alias: str | None) -> Loaded:
        """Hold a loaded engine under its name, and under the reference as the client spelled it."""
        loaded = self.models[engine.name] = Loaded(engine)
        if alias != engine.name:
            self.models[alias] = loaded  # type: ignore[index]
        return loaded

    def _evict(self) -> bool:
        """Unload the least recently used idle model; False if every one is busy."""
        idle = [(m.last_used, key) for key, m in self.models.items() if m.in_flight == 0]
        if not idle:
            return False
        self._unload(min(idle)[1])
        return True

    def _unload(self, key: str) -> None:
        loaded = self.models[key]
        for alias in [k for k, m in self.models.items() if m is loaded]:
            del self.models[alias]
        loaded.engine.close()

    def keep_alive_of(self, loaded: Loaded) -> float:
        return loaded.keep_alive if loaded.keep_alive is not None else self.keep_alive

    async def reap(self) -> None:
        """Unload models idle for longer than their keep_alive (run periodically)."""
        async with self._lock:
            now = time.monotonic()
            for key, loaded in list(self.models.items()):
                keep = self.keep_alive_of(loaded)
                if key in self.models and loaded.in_flight == 0 and 0 <= keep < now - loaded.last_used:
                    self._unload(key)

    def unique(self) -> list[Loaded]:
        return list({id(m): m for m in self.models.values()}.values())

    def close(self) -> None:
        for loaded in self.unique():
            loaded.engine.close()
        self.models.clear()
