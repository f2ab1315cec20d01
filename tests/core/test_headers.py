"""Tests for proxy.core.headers: which headers cross the proxy, in either direction."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from multidict import CIMultiDict

from proxy.core.headers import HOP_BY_HOP, bodyless_head, request_headers, response_headers

Policy = Callable[[list[tuple[str, str]]], CIMultiDict[str]]

# Spelled out here, not read from HOP_BY_HOP, so that dropping one from the module fails.
HOP_BY_HOP_NAMES = [
    "Connection",
    "Keep-Alive",
    "Proxy-Connection",
    "Proxy-Authenticate",
    "Proxy-Authorization",
    "TE",
    "Trailer",
    "Transfer-Encoding",
    "Upgrade",
]

BOTH = pytest.mark.parametrize(
    "policy", [request_headers, response_headers], ids=["request", "response"]
)


def names(headers: CIMultiDict[str]) -> list[str]:
    """Header names in order, lower-cased."""
    return [k.lower() for k in headers]


def without_accept_encoding(headers: CIMultiDict[str]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers.items() if k.lower() != "accept-encoding"]


class TestHopByHop:
    def test_set_is_exactly_the_rfc_list(self) -> None:
        """HOP_BY_HOP is the RFC 9110 / Go hopHeaders list, lower case."""
        assert {n.lower() for n in HOP_BY_HOP_NAMES} == HOP_BY_HOP

    @BOTH
    @pytest.mark.parametrize("name", HOP_BY_HOP_NAMES)
    @pytest.mark.parametrize("case", [str, str.lower, str.upper], ids=["as_is", "lower", "upper"])
    def test_hop_by_hop_dropped(
        self, policy: Policy, name: str, case: Callable[[str], str]
    ) -> None:
        """Each hop-by-hop header is dropped in both directions, whatever its case."""
        out = policy([("X-Before", "1"), (case(name), "some-value"), ("X-After", "2")])
        assert name.lower() not in names(out)
        assert out.getall("X-Before") == ["1"]
        assert out.getall("X-After") == ["2"]

    @BOTH
    @pytest.mark.parametrize(
        ("connection", "dropped"),
        [
            ("X-Internal", ["x-internal"]),
            ("close, X-Internal", ["x-internal"]),
            ("keep-alive,  x-internal ,X-Other", ["x-internal", "x-other"]),
            ("Authorization", ["authorization"]),
            (",, X-Internal,", ["x-internal"]),
        ],
    )
    def test_headers_named_in_connection_dropped(
        self, policy: Policy, connection: str, dropped: list[str]
    ) -> None:
        """Headers named in Connection are hop-by-hop for this message and are dropped."""
        out = policy(
            [
                ("Connection", connection),
                ("X-Internal", "a"),
                ("X-Other", "b"),
                ("Authorization", "Bearer sk-1"),
                ("X-Kept", "c"),
            ]
        )
        for name in dropped:
            assert name not in names(out)
        assert "connection" not in names(out)
        assert out.getall("X-Kept") == ["c"]
        kept = {"x-internal", "x-other", "authorization"} - set(dropped)
        assert kept <= set(names(out))

    @BOTH
    def test_several_connection_headers_union(self, policy: Policy) -> None:
        """Tokens of several Connection headers all count."""
        out = policy(
            [("Connection", "X-A"), ("X-A", "1"), ("Connection", "X-B"), ("X-B", "2"), ("X-C", "3")]
        )
        assert [k.lower() for k, _ in without_accept_encoding(out)] == ["x-c"]

    @BOTH
    def test_connection_token_after_named_header(self, policy: Policy) -> None:
        """A header is dropped even when the Connection header naming it comes after it."""
        out = policy([("X-A", "1"), ("Connection", "X-A")])
        assert "x-a" not in names(out)


class TestRequestHeaders:
    @pytest.mark.parametrize(
        ("name", "value"),
        [
            ("Authorization", "Bearer sk-local-123"),
            ("X-Api-Key", "sk-local-123"),
            ("Content-Type", "application/json"),
            ("User-Agent", "OpenAI/Python 1.40.0"),
            ("Accept", "text/event-stream"),
            ("X-Stainless-Retry-Count", "0"),
            ("Cookie", "a=b"),
        ],
    )
    def test_end_to_end_kept_unchanged(self, name: str, value: str) -> None:
        """End-to-end request headers (credentials included) pass unchanged."""
        out = request_headers([(name, value)])
        assert out.getall(name) == [value]

    @pytest.mark.parametrize("name", ["Host", "host", "Content-Length", "content-length", "Expect"])
    def test_host_length_expect_dropped(self, name: str) -> None:
        """Host, Content-Length and Expect are not copied: aiohttp derives them for upstream."""
        out = request_headers([(name, "x"), ("X-Kept", "1")])
        assert name.lower() not in names(out)
        assert out.getall("X-Kept") == ["1"]

    @pytest.mark.parametrize(
        "incoming",
        [
            [],
            [("Accept-Encoding", "gzip, deflate, br")],
            [("accept-encoding", "gzip"), ("Accept-Encoding", "br")],
            [("Accept-Encoding", "identity")],
        ],
        ids=["absent", "gzip", "duplicated", "already_identity"],
    )
    def test_accept_encoding_forced_to_identity(self, incoming: list[tuple[str, str]]) -> None:
        """Accept-Encoding is always exactly one ``identity``, whatever the agent sent."""
        out = request_headers([("Authorization", "Bearer x"), *incoming])
        assert out.getall("Accept-Encoding") == ["identity"]

    def test_order_and_duplicates_preserved(self) -> None:
        """End-to-end headers keep their order and their duplicates."""
        incoming = [
            ("Content-Type", "application/json"),
            ("Host", "127.0.0.1:8080"),
            ("X-Trace", "1"),
            ("Authorization", "Bearer sk"),
            ("Connection", "keep-alive"),
            ("X-Trace", "2"),
            ("Content-Length", "123"),
            ("X-Api-Key", "k"),
            ("X-Trace", "3"),
        ]
        out = request_headers(incoming)
        assert without_accept_encoding(out) == [
            ("Content-Type", "application/json"),
            ("X-Trace", "1"),
            ("Authorization", "Bearer sk"),
            ("X-Trace", "2"),
            ("X-Api-Key", "k"),
            ("X-Trace", "3"),
        ]

    def test_returns_case_insensitive_multidict(self) -> None:
        """The result is a CIMultiDict: lookups ignore case."""
        out = request_headers([("x-api-key", "k")])
        assert isinstance(out, CIMultiDict)
        assert out["X-API-KEY"] == "k"


class TestResponseHeaders:
    @pytest.mark.parametrize("name", ["Content-Length", "content-length", "Transfer-Encoding"])
    def test_framing_dropped(self, name: str) -> None:
        """Upstream framing headers never reach the agent (aiohttp re-frames the body)."""
        out = response_headers([("Content-Type", "text/event-stream"), (name, "710")])
        assert name.lower() not in names(out)

    def test_llama_sse_headers(self) -> None:
        """llama-server's SSE headers keep order; framing and Keep-Alive are dropped."""
        incoming = [
            ("Server", "llama.cpp"),
            ("Access-Control-Allow-Origin", ""),
            ("X-Accel-Buffering", "no"),
            ("Content-Type", "text/event-stream"),
            ("Transfer-Encoding", "chunked"),
            ("Keep-Alive", "timeout=5, max=100"),
        ]
        assert list(response_headers(incoming).items()) == [
            ("Server", "llama.cpp"),
            ("Access-Control-Allow-Origin", ""),
            ("X-Accel-Buffering", "no"),
            ("Content-Type", "text/event-stream"),
        ]

    def test_duplicates_preserved(self) -> None:
        """Repeated response headers (Set-Cookie) all pass, in order."""
        incoming = [
            ("Set-Cookie", "a=1"),
            ("Connection", "close"),
            ("Set-Cookie", "b=2"),
            ("Vary", "Origin"),
            ("Set-Cookie", "c=3"),
        ]
        assert list(response_headers(incoming).items()) == [
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
            ("Vary", "Origin"),
            ("Set-Cookie", "c=3"),
        ]

    def test_no_accept_encoding_added(self) -> None:
        """Responses get no Accept-Encoding: forcing identity is for requests only."""
        assert "accept-encoding" not in names(response_headers([("Server", "llama.cpp")]))

    def test_content_encoding_passes(self) -> None:
        """Content-Encoding is end-to-end and passes unchanged."""
        out = response_headers([("Content-Encoding", "gzip")])
        assert out.getall("Content-Encoding") == ["gzip"]


@pytest.mark.parametrize(
    "head",
    [b"HTTP/1.1 204 No Content\r\n", b"HTTP/1.0 304 Not Modified\r\n", b"HTTP/1.1 204\r\n"],
)
def test_bodyless_heads(head: bytes) -> None:
    """A 204 or 304 status line, with or without its reason, starts a bodyless response."""
    assert bodyless_head(head)


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 2040 Odd\r\n",
        b"HTTP/1.1 100 Continue\r\n",
        b'{"x": "HTTP/1.1 204 No Content"}',
        b"0\r\n\r\n",
        b"",
    ],
)
def test_other_heads_are_not_bodyless(head: bytes) -> None:
    """Any other status, a body that only quotes a 204, or bytes that are no status line:
    not bodyless, so nothing after them is ever dropped."""
    assert not bodyless_head(head)
