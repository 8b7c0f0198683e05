"""Stop strings across token boundaries.

Text that could still turn into a stop string is held back, so a stop is never
half-printed before we notice it.
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...] | list[str]) -> None:
        self.stops = [s for s in stops if s]
        self._held = ""
        self.hit: str | None = None  # the stop string that ended the text (Anthropic's stop_sequence says which)

    def push(self, text: str) -> tuple[str, bool]:
        """Feed new text; returns (text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
        buf = self._held + text
        hits = [(i, s) for s, i in ((s, buf.find(s)) for s in self.stops) if i >= 0]
        if hits:
            at, self.hit = min(hits, key=lambda h: h[0])
            self._held = ""
            return buf[:at], True
        hold = max((partial_suffix(buf, s) for s in self.stops), default=0)
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def partial_suffix(buf: str, tag: str) -> int:
    """Length of the longest suffix of buf that is a proper prefix of tag (it may still become
    tag). Such a suffix starts with tag's first character, so only where that character occurs
    in buf's last len(tag) - 1 characters is tried: mostly nowhere, at the cost of one find."""
    i = buf.find(tag[0], max(0, len(buf) - len(tag) + 1))
    while i != -1:
        if tag.startswith(buf[i:]):
            return len(buf) - i
        i = buf.find(tag[0], i + 1)
    return 0
