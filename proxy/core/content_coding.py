"""A compressed request body, decoded for the analysis only: a copy, bounded.

The relay forwards a request body exactly as it arrived, ``Content-Encoding`` and all; the
analysis (the request's facts, the accounting) reads JSON, so a body sent ``gzip`` or
``deflate`` is decoded here into a copy of at most ``limit`` bytes (the relay's
``max_body_bytes``). Each decompression step is asked for at most ``limit + 1`` bytes, so a
small bomb never grows past the limit in memory. When the body cannot be decoded the
result says why, as the record's ``analysis_error``:

- ``request_body_encoding_unknown:<coding>``: a coding other than gzip, deflate, identity;
- ``request_body_encoding_invalid:<coding>``: not a valid (or a truncated) stream;
- ``request_body_decoded_over_limit:<coding>``: it decodes to more than ``limit`` bytes.
"""

from __future__ import annotations

import zlib

__all__ = ["decode_body"]

_GZIP = 16 + zlib.MAX_WBITS
_ZLIB = zlib.MAX_WBITS
_RAW = -zlib.MAX_WBITS

_WBITS: dict[str, tuple[int, ...]] = {
    "gzip": (_GZIP,),
    "x-gzip": (_GZIP,),
    # RFC 9110 §8.4.1.2: deflate is the zlib format; some clients send raw deflate
    "deflate": (_ZLIB, _RAW),
}


class _OverLimit(Exception):
    """The decoded bytes would exceed the limit."""


def decode_body(body: bytes, content_encoding: str, limit: int) -> tuple[bytes, str | None]:
    """``body`` with the codings of ``content_encoding`` undone (the last applied first), at
    most ``limit`` bytes: ``(decoded, None)``, or ``(b"", why)`` when it cannot be decoded."""
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    data = body
    for coding in reversed(codings):
        if coding in ("", "identity"):
            continue
        attempts = _WBITS.get(coding)
        if attempts is None:
            return b"", f"request_body_encoding_unknown:{coding}"
        try:
            data = _inflate_any(data, attempts, limit)
        except zlib.error:
            return b"", f"request_body_encoding_invalid:{coding}"
        except _OverLimit:
            return b"", f"request_body_decoded_over_limit:{coding}"
    return data, None


def _inflate_any(data: bytes, attempts: tuple[int, ...], limit: int) -> bytes:
    """``data`` inflated in the first of the formats ``attempts`` that reads it."""
    for wbits in attempts[:-1]:
        try:
            return _inflate(data, wbits, limit)
        except zlib.error:
            continue
    return _inflate(data, attempts[-1], limit)


def _inflate(data: bytes, wbits: int, limit: int) -> bytes:
    """Inflate ``data`` (each gzip member in turn); raise ``zlib.error`` for a stream that
    is not valid or ends early, :class:`_OverLimit` past ``limit`` decoded bytes."""
    out: list[bytes] = []
    size = 0
    while True:
        stream = zlib.decompressobj(wbits)
        piece = stream.decompress(data, limit - size + 1)
        size += len(piece)
        if size > limit:
            raise _OverLimit
        out.append(piece)
        if not stream.eof:
            raise zlib.error("the compressed stream ends early")
        data = stream.unused_data
        if not data:
            return b"".join(out)
        if wbits != _GZIP:  # only gzip has members; anything else after the end is invalid
            raise zlib.error("bytes after the end of the compressed stream")
