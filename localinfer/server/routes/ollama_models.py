"""Ollama's model-store routes under /api: tags, show and ps (what is here and what is
loaded), and pull and delete, which change the store only under `serve --allow-pull`. They
drive `localinfer pull`'s and `rm`'s code, with Ollama's field names and progress lines."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from localinfer import projector
from localinfer.engine.harmony import HarmonySyntax
from localinfer.errors import ConstraintError, ModelNotFound, UserError
from localinfer.modelfile import GGUFInfo, inspect
from localinfer.server import deps
from localinfer.server import ollama_wire as o
from localinfer.server.errors import ApiError
from localinfer.server.host import ModelHost
from localinfer.server.routes.ollama import ERRORS, NDJSON, STREAMED, line
from localinfer.store import manifests
from localinfer.store.inventory import local_names
from localinfer.store.pull import local_path
from localinfer.store.pull import pull as pull_model
from localinfer.store.refs import resolve
from localinfer.store.remove import remove_model

router = APIRouter(prefix="/api", dependencies=deps.AUTH)


def details(info: GGUFInfo) -> dict[str, object]:
    quant = next(iter(info.tensor_types), "")
    size = info.n_params
    return {
        "parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
        "parameter_size": f"{size / 1e9:.1f}B" if size >= 1e9 else f"{size / 1e6:.0f}M", "quantization_level": quant,
    }  # fmt: skip


def described(name: str, path: Path) -> dict[str, object]:
    """A model as /api/tags and /api/ps list it."""
    pulled = manifests.find(name)
    stat = path.stat()
    return {
        "name": name, "model": name, "size": stat.st_size, "digest": pulled.sha256 if pulled else "",
        "modified_at": datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z"), "details": details(inspect(path)),
    }  # fmt: skip


def path_of(name: str) -> Path:
    try:
        path = local_path(resolve(name))
    except UserError as e:
        raise ApiError(404, str(e), "not_found_error", "model") from None
    if path is None:
        raise ApiError(404, f"model '{name}' not found; pull it first", "not_found_error", "model")
    return path


@router.get("/tags", responses=ERRORS)
async def tags() -> dict:
    names = local_names()
    return {"models": await asyncio.to_thread(lambda: [described(n, path_of(n)) for n in names])}


@router.post("/show", responses=ERRORS)
async def show(body: o.ModelRequest) -> dict:
    try:
        name = body.which()
    except ConstraintError as e:
        raise ApiError(400, str(e), param="model") from None
    path = path_of(name)
    info = await asyncio.to_thread(inspect, path)
    template = info.chat_template or ""
    if info.embeds:  # Ollama's word for what its embed routes answer; a reranker's too
        capabilities = ["embedding"]
    else:
        capabilities = ["completion", *(["tools"] if "tools" in template else []), *(["thinking"] if "</think>" in template or HarmonySyntax.detect(template) else []),
                        *(["vision"] if await asyncio.to_thread(projector.of_model, path, []) else [])]  # fmt: skip
    model_info = {"general.architecture": info.architecture, "general.parameter_count": info.n_params, f"{info.architecture}.context_length": info.context_length,
                  f"{info.architecture}.embedding_length": info.n_embd, f"{info.architecture}.block_count": info.n_layer,
                  **({f"{info.architecture}.pooling_type": info.pooling} if info.embeds else {})}  # fmt: skip
    modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"modelfile": f"FROM {path}\n", "parameters": "", "template": template, "license": info.license or "", "details": details(info),
            "model_info": model_info, "capabilities": capabilities, "modified_at": modified}  # fmt: skip


@router.get("/ps", responses=ERRORS)
async def ps(host: Annotated[ModelHost, Depends(deps.host)]) -> dict:
    models = []
    for name, loaded in list(host.models.items()):
        if name != loaded.engine.name:
            continue  # an alias of a model listed under its own name
        entry = described(name, Path(loaded.engine.backend.facts.path))
        expires = loaded.last_used - time.monotonic() + time.time() + max(host.keep_alive_of(loaded), 0)
        models.append({**entry, "expires_at": datetime.fromtimestamp(expires, timezone.utc).isoformat().replace("+00:00", "Z"), "size_vram": 0, "context_length": loaded.engine.n_ctx})
    return {"models": models}


def allowed_to_change_store(request: Request) -> None:
    if not request.app.state.allow_pull:
        raise ApiError(403, "this server does not change its model store; start it with --allow-pull", "permission_error")


@router.post("/pull", responses=STREAMED, dependencies=[Depends(allowed_to_change_store)])
async def pull(body: o.ModelRequest):  # type: ignore[no-untyped-def]
    try:
        name = body.which()
        source = resolve(name)
    except UserError as e:
        raise ApiError(400, str(e), param="model") from None
    if body.stream:
        return StreamingResponse(pull_lines(name, source), media_type=NDJSON)
    try:
        await asyncio.to_thread(pull_model, source)
    except UserError as e:
        raise ApiError(400, str(e), param="model") from None
    return {"status": "success"}


async def pull_lines(name: str, source) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    """Ollama's progress lines: pulling, its bytes done of total as they move, success."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] > 0.1 or done == total:
            last[0] = time.monotonic()
            loop.call_soon_threadsafe(queue.put_nowait, {"status": f"pulling {name}", "digest": "", "total": total, "completed": done})

    yield line({"status": "pulling manifest"})
    task = asyncio.ensure_future(asyncio.to_thread(pull_model, source, progress))
    while not task.done() or not queue.empty():
        getter = asyncio.ensure_future(queue.get())
        await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            yield line(getter.result())
        else:
            getter.cancel()
    try:
        task.result()
    except UserError as e:
        yield line({"error": str(e)})
        return
    yield line({"status": "verifying sha256 digest"})
    yield line({"status": "success"})


@router.delete("/delete", response_class=Response, responses={200: {"description": "Deleted (an empty body, as Ollama answers)"}, **ERRORS}, dependencies=[Depends(allowed_to_change_store)])
async def delete(body: o.ModelRequest) -> Response:
    try:
        await asyncio.to_thread(remove_model, body.which(), lambda message: None)
    except ModelNotFound as e:
        raise ApiError(404, str(e), "not_found_error", "model") from None
    except UserError as e:
        raise ApiError(400, str(e), param="model") from None
    return Response(status_code=200)
