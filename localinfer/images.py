"""An image a user hands us (a file, a data: URL's bytes, a link the server fetches), checked before any decoder sees it:
its format and size read from its header alone. The decoder (stb_image, inside mtmd) would
otherwise allocate whatever a header claims, so a 30,000 x 30,000 "decompression bomb" of a
few KB, a 0 x 0 image or a truncated file is refused here in one line.
"""

from __future__ import annotations

import base64
import binascii
import struct
from dataclasses import dataclass
from pathlib import Path

from localinfer.errors import UserError

MAX_SIDE = 16384  # pixels: more than any projector reads (they resize to ~1-4 MP)
MAX_PIXELS = 64 * 1024 * 1024
MAX_BYTES = 64 * 1024 * 1024
FORMATS = "PNG, JPEG, WebP, GIF or BMP"


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's first start-of-frame marker."""
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        (length,) = struct.unpack(">H", data[at + 2 : at + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[at + 5 : at + 9])
            return width, height
        at += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    kind = data[12:16]
    if kind == b"VP8 " and len(data) >= 30:
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if kind == b"VP8L" and len(data) >= 25:
        (bits,) = struct.unpack("<I", data[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def image_size(data: bytes) -> tuple[str, int, int]:
    """(format, width, height) from the header; a UserError for anything else."""
    size: tuple[int, int] | None = None
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        kind, size = "PNG", struct.unpack(">II", data[16:24])
    elif data.startswith(b"\xff\xd8"):
        kind, size = "JPEG", _jpeg_size(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        kind, size = "WebP", _webp_size(data)
    elif data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        kind, size = "GIF", struct.unpack("<HH", data[6:10])
    elif data.startswith(b"BM") and len(data) >= 26:
        width, height = struct.unpack("<ii", data[18:26])
        kind, size = "BMP", (width, abs(height))
    else:
        raise UserError(f"not a {FORMATS} image")
    if size is None:
        raise UserError(f"a {kind} image whose header is cut short or damaged")
    return kind, int(size[0]), int(size[1])


def checked_image(data: bytes, name: str = "the image") -> bytes:
    """`data` if it is an image of a format and size we hand to the decoder."""
    if len(data) > MAX_BYTES:
        raise UserError(f"{name} is {len(data) / 1e6:.0f} MB: images of at most {MAX_BYTES // 1024 // 1024} MiB are read")
    try:
        kind, width, height = image_size(data)
    except UserError as e:
        raise UserError(f"{name}: {e}") from None
    if width <= 0 or height <= 0:
        raise UserError(f"{name} is a {width} x {height} {kind}: an image has pixels")
    if width > MAX_SIDE or height > MAX_SIDE or width * height > MAX_PIXELS:
        raise UserError(f"{name} is a {width} x {height} {kind}: images of at most {MAX_SIDE} pixels a side and {MAX_PIXELS // 2**20} MP are read")
    return data


def read_image(path: Path) -> bytes:
    """An image file's bytes, checked."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise UserError(f"cannot read the image {path}: {e.strerror or e}") from None
    return checked_image(data, Path(path).name)


@dataclass(frozen=True)
class ImageLink:
    """An image a request names by an http(s) URL: fetched only by a server started with
    --allow-fetch (server/fetch.py), since a server that fetched whatever a request names
    could be made to reach any address it can."""

    url: str
    name: str  # "image 2": what an error calls it


ImageInput = bytes | ImageLink  # a request's image: its checked bytes, or a link to fetch


def is_link(url: str) -> bool:
    return url[:8].lower().startswith(("http://", "https://"))


def image_from_url(url: str, name: str = "the image") -> ImageInput:
    """An image a request gives as a data: URL (data:image/...;base64,...), checked; an
    http(s) URL is handed back as an ImageLink, for the server to fetch or refuse."""
    return ImageLink(url, name) if is_link(url) else _from_data_url(url, name)


def image_from_base64(text: str, name: str = "the image") -> bytes:
    """An image a request gives as base64 text (Ollama's `images`; a data: URL is taken too), checked."""
    return _from_data_url(text, name) if text.startswith("data:") else _decoded(text, name)


def _from_data_url(url: str, name: str) -> bytes:
    """The image in a data: URL with base64 bytes, checked."""
    head, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma or not head.endswith(";base64"):
        raise UserError(f"{name} is not a data: URL with base64 bytes (data:image/png;base64,...)")
    return _decoded(payload, name)


def _decoded(text: str, name: str) -> bytes:
    """The image in base64 text, checked."""
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise UserError(f"{name}'s base64 bytes are damaged") from None
    return checked_image(data, name)

