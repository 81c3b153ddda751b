"""Reading a request's body: bounded, within a deadline, decoded from its Content-Encoding.

The server reads bodies as they came (aiohttp's own decompression is off, see `HANDLER_ARGS`): the body is
framed by its Content-Length or chunks whatever its encoding, so a body that does not decode is answered
400 on a connection that stays usable (aiohttp decoding it itself broke the connection for the next request),
and the bound applies to the decoded bytes too, so a small compressed body cannot expand past it (413).
"""

from __future__ import annotations

import asyncio
import zlib

from aiohttp import web

from edgeattn.runtime.server.kserve import ProtocolError

CODINGS = ("gzip", "x-gzip", "deflate", "identity")  # what Triton's and KServe's clients send
THREAD_BYTES = 64 << 10  # compressed bodies larger than this are decoded in a thread (zlib lets go of the GIL)
HANDLER_ARGS = {"auto_decompress": False}  # for web.Application(handler_args=...), with the header timeout


def _codings(request: web.Request) -> list[str]:
    """The body's content codings in the order they were applied (415 for one this server cannot decode)."""
    header = request.headers.get("Content-Encoding", "")
    codings = [c.strip().lower() for c in header.split(",") if c.strip()]
    unknown = [c for c in codings if c not in CODINGS]
    if unknown:
        raise ProtocolError(f"Content-Encoding: expected {', '.join(CODINGS)}, found {unknown[0][:40]!r}", 415)
    return [c for c in codings if c != "identity"]


def _too_large(limit: int, found: str) -> ProtocolError:
    return ProtocolError(f"request body: expected at most {limit} bytes, found {found}", 413)


async def _read_raw(request: web.Request, limit: int) -> bytes:
    chunks, size = [], 0
    try:
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit, f"more than {limit}")
            chunks.append(chunk)
    except web.RequestPayloadError as exc:  # broken chunked framing: the connection cannot go on
        raise ProtocolError(f"request body: {' '.join(str(exc).split())}", 400) from None
    return b"".join(chunks)


def _inflate(raw: bytes, coding: str, limit: int) -> bytes:
    """One content coding undone, at most `limit` bytes out (gzip may hold several members)."""
    gzip = coding in ("gzip", "x-gzip")
    out, rest = [], raw
    while rest:
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
        try:
            part = stream.decompress(rest, limit + 1 - sum(map(len, out)))
        except zlib.error as exc:
            if gzip or out:
                raise ProtocolError(f"request body: expected {coding} data (Content-Encoding), found bytes that "
                                    f"do not decode: {exc}") from None
            return _raw_deflate(rest, limit)  # "deflate" without the zlib header, as some clients send it
        out.append(part)
        if sum(map(len, out)) > limit or stream.unconsumed_tail:
            raise _too_large(limit, f"more than {limit} once decoded ({coding})")
        if not stream.eof:
            raise ProtocolError(f"request body: expected {coding} data (Content-Encoding), found it cut short")
        rest = stream.unused_data
        if rest and not gzip:
            raise ProtocolError(f"request body: expected {coding} data (Content-Encoding), found {len(rest)} "
                                f"bytes after its end")
    return b"".join(out)


def _raw_deflate(raw: bytes, limit: int) -> bytes:
    stream = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        out = stream.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise ProtocolError(f"request body: expected deflate data (Content-Encoding), found bytes that do not "
                            f"decode: {exc}") from None
    if len(out) > limit or stream.unconsumed_tail:
        raise _too_large(limit, f"more than {limit} once decoded (deflate)")
    if not stream.eof or stream.unused_data:
        raise ProtocolError("request body: expected deflate data (Content-Encoding), found it cut short or "
                            "followed by other bytes")
    return out


def _decode(raw: bytes, codings: list[str], limit: int) -> bytes:
    for coding in reversed(codings):
        raw = _inflate(raw, coding, limit)
    return raw


async def read_body(request: web.Request, *, limit: int, timeout: float) -> bytes:
    """The whole body, decoded, at most `limit` bytes (413 beyond, before reading when Content-Length says
    so), received within `timeout` s (408 after it: a slow client must not hold a connection)."""
    codings = _codings(request)
    length = request.content_length
    if length is not None and length > limit:
        raise _too_large(limit, f"Content-Length {length}")
    try:
        raw = await asyncio.wait_for(_read_raw(request, limit), timeout)
    except asyncio.TimeoutError:
        raise ProtocolError(f"request body: expected {length if length is not None else 'all its'} bytes within "
                            f"{timeout:g} s, the client sent them too slowly", 408) from None
    if not codings or not raw:
        return raw
    if len(raw) <= THREAD_BYTES:
        return _decode(raw, codings, limit)
    return await asyncio.get_running_loop().run_in_executor(None, _decode, raw, codings, limit)
