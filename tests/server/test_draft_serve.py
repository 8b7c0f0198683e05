"""`serve --draft MODEL`: a draft model's speculation batched with requests that do not draft."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.engine.speculative import DraftConfig
from localinfer.engine.types import SamplingParams
from localinfer.errors import UserError
from localinfer.server.host import ModelHost
from tests.engine.test_draft_model import with_token

from ..conftest import THREADS
from .test_serve import Server

PROMPTS = ["Write a Python function that reverses a list.", "Tell me about the moon.", "Name three rivers.", "Explain what a CPU cache is."]
MAX_TOKENS = 48


def test_four_streams_two_drafting_and_two_not_each_answer_as_plain_decoding(f32_path: Path, model_path: Path) -> None:
    """Native engine, F32 target (a row's logits do not depend on the rows beside it, so a
    greedy answer does not depend on what shares its batch), the embedded Q4_1 as the draft;
    two of four concurrent streams ask for no drafting (llama-server's speculative.n_max 0)."""
    reference = open_engine(str(f32_path), LoadOptions(engine="native", ctx=1024, threads=THREADS, draft=None))
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, repeat_penalty=1.0)
    try:
        want = [reference.complete(reference.tokenize_prompt(reference.render_chat([{"role": "user", "content": p}])), greedy).text for p in PROMPTS]
    finally:
        reference.close()
    server = Server(str(f32_path), "--engine", "native", "--parallel", "4", "--ctx", "1024", "--draft", str(model_path))
    try:
        client, got = server.client(), {}

        def stream(i: int) -> None:
            extra = {"repeat_penalty": 1.0, **({"speculative.n_max": 0} if i % 2 else {})}
            chunks = client.chat.completions.create(model=str(f32_path), messages=[{"role": "user", "content": PROMPTS[i]}], temperature=0,
                                                    max_tokens=MAX_TOKENS, stream=True, extra_body=extra)  # fmt: skip
            text, rid = "", None
            for chunk in chunks:
                rid = chunk.id
                text += "".join(c.delta.content or "" for c in chunk.choices)
            got[i] = (rid, text)

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert sorted(got) == [0, 1, 2, 3]
        assert [got[i][1] for i in range(4)] == want
        log = server.log_text()
        for i, (rid, _) in got.items():
            line = re.search(rf"request {rid} .* drafted model (\d+)/(\d+) lookup (\d+)/(\d+)", log)
            assert line, log
            model_accepted, model_drafted, _, lookup_drafted = map(int, line.groups())
            if i % 2:
                assert model_drafted == lookup_drafted == 0
            else:
                assert model_drafted > 0 and model_accepted > 0
        metrics = server.metrics()
        assert metrics['localinfer_draft_tokens_total{source="model"}'] >= metrics['localinfer_draft_accepted_tokens_total{source="model"}'] > 0
    finally:
        server.stop()


def test_a_model_loaded_on_demand_takes_the_draft_only_where_it_fits(model_path: Path, tmp_path: Path) -> None:
    """serve's --draft MODEL is an error for the model serve starts with; a model a request
    loads later, of another tokenizer, runs with prompt lookup alone and a warning instead of
    being refused."""
    other = str(with_token(model_path, tmp_path / "other-vocab.gguf", 1000, "zzqx"))
    host = ModelHost(other, LoadOptions(engine="llama.cpp", ctx=256, draft=DraftConfig(), draft_model=str(model_path)))
    with pytest.raises(UserError, match="cannot use the draft model .*not the same tokenizer"):
        host._load(other)  # noqa: SLF001 - the default model: the draft was asked for it
    host = ModelHost(str(model_path), host.options)
    engine = host._load(other)  # noqa: SLF001 - a model on demand
    try:
        assert engine.drafter is None and any("not the same tokenizer" in w and "prompt lookup alone" in w for w in engine.warnings)
    finally:
        engine.close()
