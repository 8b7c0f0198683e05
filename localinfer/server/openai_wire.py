"""OpenAI's shapes for what the engine returns: usage, logprobs, tool calls, model cards."""

from __future__ import annotations

from localinfer.engine.engine import Engine
from localinfer.engine.tools import ToolCall
from localinfer.engine.types import CompletionOutput, TokenEvent
from localinfer.server import protocol as p
from localinfer.server.host import Loaded


def model_card(name: str, loaded: Loaded | None) -> p.ModelCard:
    """A model as /v1/models lists it: with its engine, and why, once it is loaded."""
    if loaded is None:
        return p.ModelCard(id=name)
    choice = loaded.engine.choice
    return p.ModelCard(id=name, engine=loaded.engine.backend.name, engine_reason=choice.reason if choice else None, kind=loaded.engine.kind)


def wire_call(call: ToolCall) -> p.MessageToolCall:
    return p.MessageToolCall(id=call.id, function=p.FunctionCall(name=call.name, arguments=call.arguments))


def token_text(engine: Engine, token: int) -> tuple[str, list[int]]:
    raw = engine.backend.token_bytes(token)
    return raw.decode("utf-8", "replace"), list(raw)


def chat_logprobs(engine: Engine, events: list[TokenEvent]) -> p.ChoiceLogprobs:
    content = []
    for e in events:
        if e.logprob is None:
            continue  # a stop string's held-back tail: text, not a token
        text, raw = token_text(engine, e.token)
        tops = []
        for alternative, lp in e.top_logprobs or []:
            alt_text, alt_bytes = token_text(engine, alternative)
            tops.append(p.TopLogprob(token=alt_text, logprob=lp, bytes=alt_bytes))
        content.append(p.TokenLogprob(token=text, logprob=e.logprob, bytes=raw, top_logprobs=tops))
    return p.ChoiceLogprobs(content=content)


def completion_logprobs(engine: Engine, events: list[TokenEvent]) -> p.CompletionLogprobs:
    out = p.CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    offset = 0
    for e in events:
        if e.logprob is None:
            continue
        text = token_text(engine, e.token)[0]
        out.tokens.append(text)
        out.token_logprobs.append(e.logprob)
        out.top_logprobs.append({token_text(engine, t)[0]: lp for t, lp in e.top_logprobs or []})
        out.text_offset.append(offset)
        offset += len(text)
    return out


def usage(*outs: CompletionOutput) -> p.Usage:
    """One request's usage over its choices: the prompt once, every choice's answer."""
    completion = sum(o.completion_tokens for o in outs)
    return p.Usage(
        prompt_tokens=outs[0].prompt_tokens, completion_tokens=completion, total_tokens=outs[0].prompt_tokens + completion,
        prompt_tokens_details={"cached_tokens": outs[0].cached_tokens},
        completion_tokens_details={"reasoning_tokens": sum(o.reasoning_tokens for o in outs)},
    )  # fmt: skip
