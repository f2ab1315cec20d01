"""The bounded decoding of a compressed request body for the analysis
(:mod:`proxy.core.content_coding`)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from proxy.core.content_coding import decode_body

PLAIN = b'{"messages":[{"role":"user","content":"' + b"hello " * 200 + b'"}]}'


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


class TestDecoded:
    @pytest.mark.parametrize(
        ("coding", "packed"),
        [
            ("gzip", gzip.compress(PLAIN)),
            ("x-gzip", gzip.compress(PLAIN)),
            ("GZIP ", gzip.compress(PLAIN)),
            ("deflate", zlib.compress(PLAIN)),
            ("deflate", _raw_deflate(PLAIN)),
            ("identity", PLAIN),
            ("identity, gzip", gzip.compress(PLAIN)),
            ("deflate, gzip", gzip.compress(zlib.compress(PLAIN))),
        ],
        ids=["gzip", "x-gzip", "case-space", "zlib", "raw-deflate", "identity", "with-id", "two"],
    )
    def test_known_codings_decode(self, coding: str, packed: bytes) -> None:
        """gzip, deflate (zlib or raw) and identity, alone or listed, give the plain bytes."""
        assert decode_body(packed, coding, len(PLAIN)) == (PLAIN, None)

    def test_gzip_members_are_all_decoded(self) -> None:
        """A gzip body of several members (RFC 1952 §2.2) decodes to all of them."""
        packed = gzip.compress(PLAIN[:100]) + gzip.compress(PLAIN[100:])
        assert decode_body(packed, "gzip", len(PLAIN)) == (PLAIN, None)

    def test_exactly_the_limit_passes(self) -> None:
        """A body decoding to exactly ``limit`` bytes is decoded; one byte less is over."""
        packed = gzip.compress(PLAIN)
        assert decode_body(packed, "gzip", len(PLAIN))[1] is None
        assert decode_body(packed, "gzip", len(PLAIN) - 1) == (
            b"",
            "request_body_decoded_over_limit:gzip",
        )


class TestNotDecoded:
    def test_bomb_stops_at_the_limit(self) -> None:
        """64 MiB of zeros in 64 KiB of gzip is refused at a 1 MiB limit (never inflated)."""
        bomb = gzip.compress(bytes(64 * 1024 * 1024), 9)
        assert len(bomb) < 100 * 1024
        assert decode_body(bomb, "gzip", 1024 * 1024) == (
            b"",
            "request_body_decoded_over_limit:gzip",
        )

    @pytest.mark.parametrize(
        ("coding", "body", "why"),
        [
            ("gzip", b"plain text", "request_body_encoding_invalid:gzip"),
            ("gzip", gzip.compress(PLAIN)[:-4], "request_body_encoding_invalid:gzip"),
            ("gzip", gzip.compress(PLAIN) + b"junk", "request_body_encoding_invalid:gzip"),
            ("deflate", zlib.compress(PLAIN) + b"x", "request_body_encoding_invalid:deflate"),
            ("deflate", b"\xff\xfe", "request_body_encoding_invalid:deflate"),
            ("br", b"\x0b\x02\x80", "request_body_encoding_unknown:br"),
            ("gzip, zstd", b"\x28\xb5\x2f\xfd", "request_body_encoding_unknown:zstd"),
        ],
        ids=["not-gzip", "truncated", "trailing", "zlib-trailing", "not-deflate", "br", "zstd"],
    )
    def test_undecodable_says_why(self, coding: str, body: bytes, why: str) -> None:
        """A body that is not what its coding says, or in a coding the proxy does not
        decode, gives no bytes and the reason."""
        assert decode_body(body, coding, 1 << 20) == (b"", why)
