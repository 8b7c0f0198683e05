"""A request's image links, fetched only by `serve --allow-fetch`: off by default, since a
server that fetched whatever a request names could be made to reach any address it can.
With it, a request's links are fetched in order under one time bound and one byte bound
(counted as the body streams in, never read past), following a few redirects to http(s)
only, and each body is checked from its header as any other image. Any failure is a
UserError naming the image and the reason, which the routes answer as a 400."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from localinfer.errors import UserError
from localinfer.images import MAX_BYTES, ImageInput, ImageLink, checked_image

FETCH_SECONDS = 10.0  # connecting, redirects and bodies: all of a request's links together
MAX_REDIRECTS = 3


@dataclass(frozen=True)
class FetchLimits:
    """How far a request's links may take the server (every one of them together)."""

    seconds: float = FETCH_SECONDS
    max_bytes: int = MAX_BYTES
    max_redirects: int = MAX_REDIRECTS


def mib(n: int) -> str:
    return f"{n / 2**20:.3g} MiB"


def shown(url: str) -> str:
    """A URL as an error quotes it: whole, unless it is long."""
    return url if len(url) <= 100 else url[:97] + "..."


async def fetched_images(items: Sequence[ImageInput], limits: FetchLimits | None) -> list[bytes]:
    """`items`' bytes, each link fetched under `limits` (None: links are refused)."""
    links = [item for item in items if isinstance(item, ImageLink)]
    if not links:
        return [item for item in items if isinstance(item, bytes)]
    if limits is None:
        raise UserError(f"{links[0].name} is a link ({shown(links[0].url)}), which this server does not fetch: send the image itself as a data: URL "
                        "(data:image/png;base64,...), or start the server with --allow-fetch")  # fmt: skip
    fetcher = _Fetcher(limits)
    async with httpx.AsyncClient(timeout=limits.seconds, follow_redirects=False, headers={"Accept": "image/*"}) as client:
        try:
            async with asyncio.timeout(limits.seconds):
                return [item if isinstance(item, bytes) else await fetcher.image(client, item) for item in items]
        except TimeoutError:
            link = fetcher.current
            raise UserError(f"{link.name}: fetching {shown(link.url)} took over {limits.seconds:g} s (the time a request's links have)") from None


class _Fetcher:
    """One request's fetches: the bytes they have brought so far, and the link at hand."""

    def __init__(self, limits: FetchLimits) -> None:
        self.limits = limits
        self.used = 0  # bytes of the request's earlier links
        self.current = ImageLink("", "")

    async def image(self, client: httpx.AsyncClient, link: ImageLink) -> bytes:
        """The image `link` names, after at most max_redirects redirects, checked."""
        self.current = link
        try:
            url = httpx.URL(link.url)
            for _ in range(self.limits.max_redirects + 1):
                async with client.stream("GET", url) as response:
                    if not response.is_redirect:
                        return checked_image(await self.body(response, link), f"{link.name} ({shown(str(response.url))})")
                    url = self.redirect(response, link)
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            raise UserError(f"{link.name}: cannot fetch {shown(link.url)}: {str(e) or type(e).__name__}") from None
        raise UserError(f"{link.name}: {shown(link.url)} redirects more than {self.limits.max_redirects} times")

    def redirect(self, response: httpx.Response, link: ImageLink) -> httpx.URL:
        """Where a redirect leads, if it leads to http(s)."""
        target = response.url.join(response.headers.get("location", ""))
        if target.scheme not in ("http", "https"):
            raise UserError(f"{link.name}: {shown(link.url)} redirects to {shown(str(target))}: only http(s) links are followed")
        return target

    async def body(self, response: httpx.Response, link: ImageLink) -> bytes:
        """The response's body, if it is a success and fits in the bytes the request has left."""
        if not response.is_success:
            raise UserError(f"{link.name}: {shown(str(response.url))} answered {response.status_code} {response.reason_phrase}".rstrip())
        left = self.limits.max_bytes - self.used
        too_big = UserError(f"{link.name}: {shown(str(response.url))} sends more than the {mib(self.limits.max_bytes)} a request's fetched images may hold")
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > left:
            raise too_big
        data = bytearray()
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) > left:
                raise too_big  # the stream is closed unread past here
        self.used += len(data)
        return bytes(data)
