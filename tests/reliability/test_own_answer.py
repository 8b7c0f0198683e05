"""The load scenario's test of whether a streamed answer is its prompt's own, on engines whose
rounding depends on the batch (a GPU) as well as on those where it does not."""

from __future__ import annotations

from .serving import is_its_own

REFS = {"Why is the sky blue?": "The sky is blue because of Rayleigh scattering", "Name a prime.": "Seven is a prime number", "Say hi.": "Hi there"}


def test_batch_invariant_engines_need_the_exact_answer() -> None:
    assert is_its_own("Hi there", "Say hi.", REFS, exact=True)
    assert not is_its_own("Hi therefore", "Say hi.", REFS, exact=True)


def test_a_gpu_answer_may_part_after_a_common_start() -> None:
    assert is_its_own("The sky is blue because light scatters", "Why is the sky blue?", REFS, exact=False)
    assert is_its_own("Hi there", "Say hi.", REFS, exact=False)


def test_a_gpu_answer_may_part_at_the_first_token() -> None:
    """Random weights leave the top logits close: one batch's rounding picks another first token."""
    assert is_its_own("Greetings to you", "Say hi.", REFS, exact=False)


def test_a_token_from_another_stream_still_shows() -> None:
    assert not is_its_own("Seven is a prime number", "Why is the sky blue?", REFS, exact=False)  # another prompt's answer
    assert not is_its_own("Hi there", "Name a prime.", REFS, exact=False)
    assert not is_its_own("", "Say hi.", REFS, exact=False)  # nothing in common with anything


def test_alike_references_cannot_tell_streams_apart() -> None:
    """Random weights repeat one token whatever the prompt: then any answer that starts like the
    shared reference passes, since no other prompt's differs from it."""
    same = dict.fromkeys(REFS, "eighteen eighteen eighteen")
    assert is_its_own("eighteen eighteen eight", "Say hi.", same, exact=False)
