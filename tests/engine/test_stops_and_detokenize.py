"""Stop strings across token boundaries, and UTF-8 that survives being cut between tokens."""

from localinfer.engine.detokenize import StreamDetokenizer
from localinfer.engine.stops import StopMatcher


def test_stop_split_across_pushes_is_never_printed() -> None:
    m = StopMatcher(["</end>"])
    out = []
    for piece in ["Hello </", "en", "d> tail"]:
        text, hit = m.push(piece)
        out.append(text)
        if hit:
            break
    assert "".join(out) == "Hello " and hit


def test_false_alarm_is_released() -> None:
    m = StopMatcher(["STOP"])
    assert m.push("ST") == ("", False)
    assert m.push("ART") == ("START", False)
    assert m.flush() == ""


def test_held_text_is_flushed_at_the_end() -> None:
    m = StopMatcher(["STOP"])
    assert m.push("abc ST") == ("abc ", False)
    assert m.flush() == "ST"


def test_utf8_split_inside_a_character() -> None:
    data = "é日🎉".encode()
    pieces = {i: bytes([b]) for i, b in enumerate(data)}  # one byte per "token"
    d = StreamDetokenizer(pieces.__getitem__)
    out = [d.push(i) for i in range(len(data))]
    assert "".join(out) + d.flush() == "é日🎉"
    assert all(ch != "\ufffd" for ch in "".join(out))


def test_dangling_bytes_become_a_replacement_character() -> None:
    d = StreamDetokenizer({0: b"ok", 1: "🎉".encode()[:2]}.__getitem__)
    assert d.push(0) + d.push(1) + d.flush() == "ok\ufffd"
