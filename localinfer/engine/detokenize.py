"""Streaming detokenization that never splits a UTF-8 character.

Tokens are byte strings; one emoji or CJK character can span several tokens. An
incremental decoder holds back an incomplete sequence until the bytes that finish it arrive.
"""

from __future__ import annotations

import codecs
from typing import Callable


class StreamDetokenizer:
    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        """Text completed by this token (may be empty)."""
        return self._decoder.decode(self._token_bytes(token))

    def flush(self) -> str:
        """Whatever is left at the end; a dangling partial character becomes U+FFFD."""
        return self._decoder.decode(b"", final=True)
