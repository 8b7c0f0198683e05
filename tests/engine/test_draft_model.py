"""Speculative decoding with a draft model: lossless on the real model (target F32, draft the
embedded Q4_1 of the same weights, both engines), with a bad draft, under a grammar and stop
strings; the speculative-sampling rule against its closed form; the draft's vocabulary check
and its failures."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends import get_backend
from localinfer.backends.base import LoadParams
from localinfer.backends.native import NativeBackend
from localinfer.engine.draft_model import DRAFT_SAMPLES, DraftModel, check_vocab
from localinfer.engine.engine import Engine
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.engine.speculative import DraftConfig, speculative_choice
from localinfer.engine.types import SamplingParams
from localinfer.errors import UserError

from ..conftest import THREADS, complete_together, llama_quantize, read_gguf
from ..native.test_architectures import first_tokens, tiny_model, vocabulary  # noqa: F401 - vocabulary: the fixture
from .test_constraints import PERSON
from .test_speculative import CHEAP_VERIFIES, Fresh, chat, fits

PROMPTS = ["Write a Python function that checks whether a number is prime.", "Tell me a short story about a dragon."]
GREEDY = SamplingParams(temperature=0, max_tokens=96, repeat_penalty=1.0)


@pytest.fixture(scope="module", params=["llama.cpp", "native"])
def pair(request, f32_path: Path, model_path: Path):
    """(target F32, draft Q4_1) on one engine, two sequences each."""
    cls = get_backend(request.param)
    params = LoadParams(n_ctx=2048, n_threads=THREADS, n_seq_max=2)
    target, draft = cls.load(f32_path, params), cls.load(model_path, params)
    yield target, draft
    draft.close()
    target.close()


def engines(target, draft) -> tuple[Engine, Engine]:
    """(plain, speculative with the draft) on one target backend, with fixed costs
    (CHEAP_VERIFIES) so that draft lengths do not depend on how busy the machine is."""
    spec = Fresh(target, slots=2, draft=DraftConfig(assumed_costs=CHEAP_VERIFIES, assumed_draft_step=0.2), drafter=DraftModel(draft, 2, "draft"))
    return Fresh(target, slots=2), spec


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_with_a_draft_model_is_token_for_token_plain_decoding(pair, prompt: str) -> None:
    plain, spec = engines(*pair)
    tokens = chat(plain, prompt)
    a, b = plain.complete(tokens, GREEDY), spec.complete(tokens, GREEDY)
    assert b.tokens == a.tokens and b.finish_reason == a.finish_reason and b.text == a.text
    t = b.timings
    assert t.model_accepted > 0 and t.model_drafted >= t.model_accepted and t.tokens_per_forward > 1.0
    assert t.drafted == t.model_drafted + t.lookup_drafted and t.accepted == t.model_accepted + t.lookup_accepted


def test_a_request_that_ends_inside_a_draft_counts_it(pair) -> None:
    """Three tokens: the first from the prompt's forward, then one drafted token verified
    with its bonus row, which ends the request where the draft is kept. The draft is judged
    before the request finishes, so its timings hold it either way."""
    plain, spec = engines(*pair)
    out = spec.complete(chat(plain, PROMPTS[1]), replace(GREEDY, max_tokens=3))
    assert len(out.tokens) == 3 and out.timings.model_drafted == 1


def test_nothing_stands_between_the_prompt_and_its_first_token(pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step that ends the prompt gives the first token without feeding the draft: a
    one-token answer costs the draft model no forward at all; the draft catches the prompt up
    a step later, and the answer is plain decoding's."""
    target, draft = pair
    fed: list[int] = []
    forward = draft.forward
    monkeypatch.setattr(draft, "forward", lambda batch: (fed.append(len(batch.tokens)), forward(batch))[1])
    plain, spec = engines(target, draft)
    tokens = chat(plain, PROMPTS[0])
    one = spec.complete(tokens, replace(GREEDY, max_tokens=1))
    assert one.tokens == plain.complete(tokens, replace(GREEDY, max_tokens=1)).tokens and fed == []
    more = spec.complete(tokens, replace(GREEDY, max_tokens=8))
    assert more.tokens == plain.complete(tokens, replace(GREEDY, max_tokens=8)).tokens and sum(fed) >= len(tokens)


def test_a_drafts_cost_is_timed_from_its_first_position_and_the_ones_after(pair) -> None:
    """Nothing is known before DRAFT_SAMPLES drafts were timed (the prior stands in); then a
    k-token draft costs its first position (which also feeds what the target accepted) and
    k - 1 later ones, each timed apart."""
    target, draft = pair
    plain, spec = engines(target, draft)
    assert spec.drafter.draft_seconds(1) is None
    out = spec.complete(chat(plain, PROMPTS[0]), GREEDY)
    assert out.timings.model_drafted >= DRAFT_SAMPLES
    first, second, third = (spec.drafter.draft_seconds(k) for k in (1, 2, 3))
    assert 0 < first and 0 < second - first and third - second == pytest.approx(second - first) and spec.drafter.draft_seconds(0) == 0


@pytest.fixture(scope="module")
def shuffled_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shuffled(model_path, tmp_path_factory.mktemp("shuffled") / "shuffled.gguf")


def test_a_bad_draft_costs_speed_never_tokens(pair, shuffled_path: Path) -> None:
    """The same vocabulary, its weights' rows shuffled: most drafts fail, the answer does not
    change, and drafting switches itself off for the request."""
    target, draft = pair
    bad = type(draft).load(shuffled_path, LoadParams(n_ctx=2048, n_threads=THREADS, n_seq_max=2))
    try:
        plain, spec = engines(target, bad)
        tokens = chat(plain, PROMPTS[1])
        params = SamplingParams(temperature=0, max_tokens=72, repeat_penalty=1.0)
        a, b = plain.complete(tokens, params), spec.complete(tokens, params)
        assert b.tokens == a.tokens and b.text == a.text
        t = b.timings
        assert 0 < t.model_drafted and t.model_accepted / t.model_drafted < 0.3
        assert t.model_drafted < len(b.tokens) / 2  # switched off, not drafting every step
    finally:
        bad.close()


def test_a_draft_model_under_a_grammar_and_a_stop_string(pair) -> None:
    """Structured output masks both the draft's q and the target's p; a stop string ends a
    run of accepted drafts where plain decoding ends."""
    from localinfer.engine.constraints import Constraint

    plain, spec = engines(*pair)
    tokens = chat(plain, "Describe a person named Ada Lovelace as JSON.")
    constrained = SamplingParams(temperature=0, max_tokens=120, repeat_penalty=1.0, constraint=Constraint.json_schema(PERSON))
    a, b = plain.complete(tokens, constrained), spec.complete(tokens, constrained)
    assert b.tokens == a.tokens and b.finish_reason == a.finish_reason
    assert b.timings.model_accepted > 0
    json.loads(b.text)
    prompt = chat(plain, PROMPTS[0])
    whole = plain.complete(prompt, GREEDY)
    stop = whole.text[len(whole.text) // 2 :][:5]
    with_stop = SamplingParams(temperature=0, max_tokens=96, repeat_penalty=1.0, stop=(stop,))
    a, b = plain.complete(prompt, with_stop), spec.complete(prompt, with_stop)
    assert b.text == a.text and b.finish_reason == a.finish_reason == "stop" and stop not in b.text


def test_the_rule_leaves_the_targets_distribution_and_rejections_draw_the_residual() -> None:
    """d ~ q, kept with probability min(1, p/q), else drawn from norm(max(0, p - q)): every
    output follows p, and the rejections alone follow the residual (closed form), for a q
    that puts mass where p has none. Chi-square on 30,000 draws each."""
    rng = np.random.default_rng(3)
    p_ids, p = np.array([4, 7, 9, 2]), np.array([0.5, 0.25, 0.15, 0.10])
    q_ids, q = np.array([7, 4, 11, 9]), np.array([0.45, 0.2, 0.25, 0.10])  # 11: a token p never takes
    n, out, rejected = 30_000, [], []
    for _ in range(n):
        d = int(q_ids[rng.choice(4, p=q)])
        token = speculative_choice(p_ids, p, q_ids, q, d, rng)
        out.append(token)
        if token != d:
            rejected.append(token)
    counts = lambda seen, ids: np.array([seen.count(int(i)) for i in ids])  # noqa: E731
    assert fits(counts(out, p_ids), p) and 11 not in out
    q_on_p = np.array([0.2, 0.45, 0.10, 0.0])
    residual = np.maximum(p - q_on_p, 0)  # [0.3, 0, 0.05, 0.1]: only 4, 9 and 2 are drawn on rejection
    assert set(rejected) <= {4, 9, 2}
    keep = residual > 0
    assert fits(counts(rejected, p_ids[keep]), residual[keep])
    assert abs(len(rejected) / n - (1 - np.minimum(p, q_on_p).sum())) < 0.01  # P(reject) = 1 - sum(min(p, q))
    assert not fits(counts(out, p_ids), p + np.array([-0.02, 0.02, 0, 0]))  # a 2-point shift would be caught


def test_a_draft_with_another_vocabulary_is_refused_in_one_line(pair, model_path: Path, tmp_path: Path) -> None:
    target, draft = pair
    other = type(draft).load(with_token(model_path, tmp_path / "other-vocab.gguf", 1000, "zzqx"), LoadParams(n_ctx=256, n_threads=THREADS))
    try:
        with pytest.raises(UserError, match=r"token 1000 is b'zzqx'.*not the same tokenizer") as e:
            check_vocab(target, other)
        assert "\n" not in str(e.value)
    finally:
        other.close()
    check_vocab(target, draft)  # the same vocabulary passes


def test_loading_a_draft_model_and_its_failures(model_path: Path, f32_path: Path, tmp_path: Path, monkeypatch) -> None:
    """A named draft that cannot be used is an error; --draft auto's is a warning, and the
    model runs with prompt lookup alone; a draft no smaller than its target is a warning;
    auto takes no draft over AUTO_DRAFT_SHARE of its target's bytes, and says nothing."""
    options = dict(engine="llama.cpp", ctx=512, draft=DraftConfig())
    with pytest.raises(UserError, match="cannot use the draft model .*missing.gguf: no such file"):
        open_engine(str(model_path), LoadOptions(**options, draft_model=str(tmp_path / "missing.gguf")))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(model_path.read_bytes()[: 1 << 20])
    with pytest.raises(UserError, match="cannot use the draft model .*broken.gguf"):
        open_engine(str(model_path), LoadOptions(**options, draft_model=str(broken)))

    from localinfer.engine import loader
    from localinfer.store.refs import resolve

    pair = {str(f32_path): str(broken)}  # what the catalog names as a model's draft

    def with_pair(ref):
        src = resolve(ref)
        src.draft = pair.get(ref)
        return src

    monkeypatch.setattr(loader, "resolve", with_pair)
    engine = open_engine(str(f32_path), LoadOptions(**options, draft_model="auto"))
    try:
        assert engine.drafter is None and any("cannot use the draft model" in w and "prompt lookup alone" in w for w in engine.warnings)
    finally:
        engine.close()
    pair[str(f32_path)] = "smollm2:135m"  # a pair that works: the catalog's embedded model (0.18 of the F32's bytes), always downloaded
    engine = open_engine(str(f32_path), LoadOptions(**options, draft_model="auto"))
    try:
        assert engine.drafter is not None and engine.drafter.name == "smollm2:135m" and not engine.warnings
    finally:
        engine.close()
    assert model_path.stat().st_size <= loader.AUTO_DRAFT_SHARE * f32_path.stat().st_size
    pair[str(model_path)] = str(f32_path)  # 5.5x its target's bytes: auto leaves it alone
    engine = open_engine(str(model_path), LoadOptions(**options, draft_model="auto"))
    try:
        assert engine.drafter is None and not engine.warnings
    finally:
        engine.close()
    monkeypatch.undo()
    engine = open_engine(str(model_path), LoadOptions(**options, draft_model=str(f32_path)))
    try:
        assert engine.drafter is not None and any("no smaller than its target" in w for w in engine.warnings)
    finally:
        engine.close()


def shuffled(model_path: Path, out: Path) -> Path:
    """A copy of a GGUF with each tensor's rows (a 1-D tensor's values) in a seeded random order."""
    import gguf
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    reader = read_gguf(model_path)
    copy_with_new_metadata(reader, gguf.GGUFWriter(out, arch=reader.fields["general.architecture"].contents(), endianess=reader.endianess), {}, [])
    rng = np.random.default_rng(0)
    for tensor in gguf.GGUFReader(out, "r+").tensors:
        tensor.data[...] = tensor.data[rng.permutation(len(tensor.data))]
    return out


def with_token(model_path: Path, out: Path, token: int, text: str) -> Path:
    """A copy of a GGUF whose token `token` reads `text`: another tokenizer, one token apart."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = read_gguf(model_path)
    key = gguf.Keys.Tokenizer.LIST
    tokens = reader.fields[key].contents()
    tokens[token] = text
    writer = gguf.GGUFWriter(out, arch=reader.fields["general.architecture"].contents(), endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {key: MetadataDetails(gguf.GGUFValueType.ARRAY, tokens, sub_type=gguf.GGUFValueType.STRING)}, [])
    return out


DRAWS = int(os.environ.get("LOCALINFER_SPECULATIVE_DRAWS", "1200"))  # CI's; 10,000 catch a 2-point shift here too (six minutes on 2 cores)
SHIFT = 0.05 if DRAWS < 10_000 else 0.02


def test_sampled_answers_with_a_draft_model_follow_the_targets_distribution(model_path: Path, tmp_path: Path) -> None:
    """Temperature 1.0 on the real model: the first three tokens of DRAWS seeded answers,
    drafted by a Q4_0 of the same weights (it disagrees often enough for both the rule's
    accept and its residual to matter), follow the target's exact distribution; and a shift
    of SHIFT points off the likeliest outcome is caught."""
    observed, expected, acceptance = sampled_outcomes(model_path, tmp_path / "q4_0.gguf", DRAWS, slots=16, floor=0.03)
    assert 0.1 < acceptance < 0.9  # accepts and rejections both common
    assert len(expected) >= 4 and fits(observed, expected) and not fits(observed, shifted(expected, SHIFT))


TINY_DRAWS = 8000


def test_enough_sampled_answers_to_catch_a_two_point_shift(vocabulary, tmp_path: Path) -> None:
    """The same with TINY_DRAWS answers, more than the real model can afford in the default
    suite: a tiny random-weight llama with the embedded model's first 1,024 tokens and a
    sharpened output matrix, drafted by its Q4_0. Every outcome of 1 % or more is counted
    (15 of them, 1-25 %, and 3.5 % of the rest); the chi-square test passes, and fails once
    2 points move off the likeliest outcome (in 1,000 of 1,000 multinomial simulations of
    8,000 draws from these probabilities; the unshifted test passed 999)."""
    path = tiny_model(tmp_path / "tiny.gguf", "llama", first_tokens(vocabulary, 1024), 6, 3, np.random.default_rng(7), output_scale=6.0)
    observed, expected, acceptance = sampled_outcomes(path, tmp_path / "tiny-q4_0.gguf", TINY_DRAWS, slots=32, floor=0.01)
    assert 0.1 < acceptance < 0.9
    assert len(expected) >= 4 and fits(observed, expected) and not fits(observed, shifted(expected, 0.02))


def sampled_outcomes(path: Path, draft_path: Path, draws: int, slots: int, floor: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Temperature 1.0, `draws` seeded answers of the model at `path` on the native engine,
    drafted by its Q4_0 (made at `draft_path`): how many began with each three-token sequence
    at least `floor` likely under the target, and with any other (last); those outcomes'
    exact probabilities (each prefix's own forward and the sampler's distribution); and the
    share of drafted tokens accepted. Closes both backends."""
    import llama_cpp

    from localinfer.engine.sampler import Sampler

    load_params = LoadParams(n_ctx=64, n_threads=THREADS, n_seq_max=slots)
    target = NativeBackend.load(path, load_params)
    draft = NativeBackend.load(llama_quantize(path, draft_path, llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0), load_params)
    params = SamplingParams(temperature=1.0, max_tokens=4)
    always = DraftConfig(assumed_costs=tuple(np.linspace(1.0, 1.2, 11)), assumed_draft_step=0.1)  # always worth drafting
    engine = Engine(target, slots=slots, draft=always, drafter=DraftModel(draft, slots, "draft"))
    try:
        prompt = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": "What is the capital of France?"}]))
        exact = outcome_probabilities(target, prompt, Sampler(params), depth=3, floor=floor)
        outs = complete_together(engine, [(prompt, replace(params, seed=seed)) for seed in range(draws)])
    finally:
        engine.close()
    assert len(outs) == draws
    drafted, accepted = sum(o.timings.model_drafted for o in outs), sum(o.timings.model_accepted for o in outs)
    keys = sorted(exact, key=exact.get, reverse=True)
    seen = Counter(tuple(o.tokens[:3]) for o in outs)
    observed = np.array([seen[k] for k in keys] + [draws - sum(seen[k] for k in keys)])
    expected = np.array([exact[k] for k in keys] + [1 - sum(exact.values())])
    return observed, expected, accepted / drafted


def shifted(p: np.ndarray, points: float) -> np.ndarray:
    """`p` with `points` moved from its likeliest outcome (first) to the rest (last)."""
    out = p.copy()
    out[0], out[-1] = out[0] - points, out[-1] + points
    return out


def outcome_probabilities(backend, prompt: list[int], sampler, depth: int, floor: float) -> dict[tuple[int, ...], float]:
    """P(first `depth` tokens) for every sequence at least `floor` likely, from the target's
    1-row forwards of each prefix and the sampler's own distribution."""
    from localinfer.backends.base import Batch

    frontier, out = [((), 1.0)], {}
    for level in range(depth):
        following = []
        for prefix, chance in frontier:
            backend.kv_clear(0)
            logits = backend.forward(Batch.for_sequence(prompt + list(prefix), 0, 0))[0]
            ids, probs = sampler.distribution(logits, prompt + list(prefix), list(prefix))
            for token, p in zip(ids.tolist(), probs.tolist()):
                if chance * p >= floor:
                    (out.__setitem__(prefix + (token,), chance * p) if level == depth - 1 else following.append((prefix + (token,), chance * p)))
        frontier = following
    backend.kv_clear(0)
    return out


def test_the_catalogs_drafts_are_smaller_models_of_the_catalog(tmp_path: Path) -> None:
    """Every `draft = ...` names a catalog model of the same family, of at most
    AUTO_DRAFT_SHARE of its target's parameters (its bytes' share is what auto checks; a
    draft no smaller in parameters could never pass it); `pull --with-draft` of a model
    without one says so in one line."""
    from localinfer.engine.loader import AUTO_DRAFT_SHARE
    from localinfer.store.catalog import load_catalog

    from ..cli.test_errors import assert_one_line_error
    from ..conftest import run_cli

    catalog = load_catalog()
    size = lambda alias: float(alias.split(":")[1].rstrip("bm")) * (1e-3 if alias.endswith("m") else 1)  # noqa: E731
    pairs = {alias: e.draft for alias, e in catalog.entries.items() if e.draft}
    assert len(pairs) >= 5
    for target, draft in pairs.items():
        assert draft in catalog.entries and draft.split(":")[0] in (target.split(":")[0], "llama3.2") and size(draft) <= AUTO_DRAFT_SHARE * size(target), (target, draft)
    assert_one_line_error(run_cli("pull", "smollm2:135m", "--with-draft"), "the catalog names no draft model for smollm2:135m", code=2)


def test_the_memory_check_counts_the_draft_on_top_of_its_target(model_path: Path, f32_path: Path, monkeypatch) -> None:
    """RAM for the target alone, not for its draft as well: a named draft is refused in one
    line before either model loads."""
    import types

    from localinfer import memory
    from localinfer.backends.llamacpp import LlamaCppBackend
    from localinfer.modelfile import inspect

    info = inspect(f32_path)
    alone = memory.plan_cache(info, 512, 0, ("f16", "f16"), kv_bytes=lambda kv: LlamaCppBackend.kv_cache_bytes(info, 512, 1, kv), ram_free=1 << 40)
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: types.SimpleNamespace(available=alone.total + (4 << 20)))
    with pytest.raises(UserError, match=r"cannot use the draft model .*: the model needs .* GiB of RAM") as e:
        open_engine(str(f32_path), LoadOptions(engine="llama.cpp", ctx=512, draft=DraftConfig(), draft_model=str(model_path)))
    assert "\n" not in str(e.value)
