"""Reranking, in the shape llama-server, Jina and Cohere share: a query and documents in,
the documents' indices by relevance out. /v1/rerank, and /rerank as llama-server also
answers; both only translate to Engine.rank and back."""

from __future__ import annotations

from typing import Annotated

import numpy as np
from fastapi import APIRouter, Depends, Request

from localinfer.server import deps
from localinfer.server import protocol as p
from localinfer.server.bridge import Bridge
from localinfer.server.errors import ApiError, errors
from localinfer.server.inputs import MAX_INPUTS

router = APIRouter(dependencies=deps.AUTH)
BridgeDep = Annotated[Bridge, Depends(deps.bridge)]


@router.post("/v1/rerank", response_model=p.RerankList, response_model_exclude_none=True, responses=errors(400, 401, 403, 404))
@router.post("/rerank", response_model=p.RerankList, response_model_exclude_none=True, responses=errors(400, 401, 403, 404))
async def rerank(body: p.RerankRequest, request: Request, bridge: BridgeDep) -> p.RerankList:
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    check(body, texts)
    loaded = await bridge.model(body.model)
    tokens = [loaded.engine.tokenize_pair(body.query, text) for text in texts]
    scores = await bridge.rank(loaded, tokens)
    best = np.argsort(-scores, kind="stable")[: body.top_n or len(texts)]
    results = [p.RerankResult(index=int(i), relevance_score=float(scores[i]), document=p.RerankDocument(text=texts[i]) if body.return_documents else None) for i in best]
    used = sum(len(t) for t in tokens)
    bridge.count_embedding(request.url.path, used)
    return p.RerankList(id=p.new_id("rerank"), model=loaded.engine.name, results=results, usage=p.EmbeddingUsage(prompt_tokens=used, total_tokens=used))


def check(body: p.RerankRequest, texts: list[str]) -> None:
    """A 400 naming the field, before the model is touched."""
    if not body.query:
        raise ApiError(400, "query is empty", param="query")
    if not texts:
        raise ApiError(400, "documents is empty", param="documents")
    if len(texts) > MAX_INPUTS:
        raise ApiError(400, f"documents has {len(texts)} items; at most {MAX_INPUTS} go in one request", param="documents")
    if empty := [i for i, text in enumerate(texts) if not text]:
        raise ApiError(400, f"document {empty[0]} is empty", param="documents")
    if body.top_n is not None and not 1 <= body.top_n <= len(texts):
        raise ApiError(400, f"top_n must be between 1 and the {len(texts)} documents, got {body.top_n}", param="top_n")
