"""Tests for proxy.core.sse: the incremental WHATWG event-stream framer."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.checks import oracle
from proxy.core.sse import SSEEvent, SSEFramer
from tests.profiles import examples

BOM = b"\xef\xbb\xbf"
_LINE_BREAK = re.compile(rb"\r\n|\r|\n")


def run(chunks: Iterable[bytes], cap: int = 8 * 1024 * 1024) -> tuple[list[SSEEvent], SSEFramer]:
    """Feed ``chunks`` then flush; return every event and the framer for its counters."""
    framer = SSEFramer(max_event_bytes=cap)
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += framer.feed(chunk)
    events += framer.flush()
    return events, framer


def by_size(stream: bytes, size: int) -> list[bytes]:
    return [stream[i : i + size] for i in range(0, len(stream), size)]


def by_line(stream: bytes) -> list[bytes]:
    """Split keeping each line's terminator (a CRLF stays in one piece)."""
    return re.findall(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", stream)


def split_at(stream: bytes, points: Sequence[int]) -> list[bytes]:
    cuts = [0, *sorted(points), len(stream)]
    return [stream[a:b] for a, b in pairwise(cuts)]


def modes(stream: bytes) -> dict[str, list[bytes]]:
    return {"whole": [stream], "lines": by_line(stream), "bytes": by_size(stream, 1)}


def counters(f: SSEFramer) -> tuple[int, int, int, bool]:
    return f.events, f.comments, f.oversized, f.incomplete_at_eof


SPEC_EXAMPLES: dict[str, tuple[bytes, list[SSEEvent]]] = {
    "stock-ticker": (
        b"data: YHOO\ndata: +2\ndata: 10\n\n",
        [SSEEvent(b"YHOO\n+2\n10")],
    ),
    "ids-and-comment": (
        b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\n"
        b"data:  third event\n\n",
        [
            SSEEvent(b"first event", id="1"),
            SSEEvent(b"second event", id=""),
            SSEEvent(b" third event", id=""),
        ],
    ),
    "empty-data": (
        b"data\n\ndata\ndata\n\ndata:",
        [SSEEvent(b""), SSEEvent(b"\n")],
    ),
    "space-after-colon": (
        b"data:test\n\ndata: test\n\n",
        [SSEEvent(b"test"), SSEEvent(b"test")],
    ),
    "event-types": (
        b"event: add\ndata: 73857293\n\nevent: remove\ndata: 2153\n\nevent: add\ndata: 113411\n\n",
        [
            SSEEvent(b"73857293", "add"),
            SSEEvent(b"2153", "remove"),
            SSEEvent(b"113411", "add"),
        ],
    ),
}


class TestSpecExamples:
    @pytest.mark.parametrize("mode", ["whole", "lines", "bytes"])
    @pytest.mark.parametrize("name", list(SPEC_EXAMPLES))
    def test_spec_example(self, name: str, mode: str) -> None:
        """Each WHATWG example stream yields the spec's events however it is chunked."""
        stream, expected = SPEC_EXAMPLES[name]
        events, framer = run(modes(stream)[mode])
        assert events == expected
        assert framer.events == len(expected)

    def test_comment_example_counts_comment(self) -> None:
        """The ': test stream' block dispatches nothing and counts as one comment."""
        _, framer = run([SPEC_EXAMPLES["ids-and-comment"][0]])
        assert framer.comments == 1

    def test_unterminated_last_block_flagged(self) -> None:
        """The trailing 'data:' block of the empty-data example is discarded and flagged."""
        _, framer = run([SPEC_EXAMPLES["empty-data"][0]])
        assert framer.incomplete_at_eof is True


class TestFields:
    def test_empty_data_value_dispatches_empty_string(self) -> None:
        """'data:' with no value dispatches data b'': the spec checks for an empty data
        buffer (step 2) before stripping its trailing LF (step 3), and the buffer is "\\n"."""
        assert run([b"data:\n\n"])[0] == [SSEEvent(b"")]

    def test_block_without_data_dispatches_nothing_and_resets_type(self) -> None:
        """A block with only 'event:' dispatches nothing and its type does not leak onward."""
        events, framer = run([b"event: x\n\ndata: y\n\n"])
        assert events == [SSEEvent(b"y", "message")]
        assert framer.events == 1

    def test_empty_event_field_means_message(self) -> None:
        """'event:' with an empty value leaves the type 'message'."""
        assert run([b"event:\ndata: y\n\n"])[0] == [SSEEvent(b"y")]

    def test_id_persists_across_events(self) -> None:
        """The last event ID carries over to later events, including from a data-less block."""
        events, _ = run([b"id: 7\n\ndata: a\n\ndata: b\nid: 8\n\ndata: c\n\n"])
        assert [e.id for e in events] == ["7", "8", "8"]

    def test_id_with_nul_ignored(self) -> None:
        """An 'id' containing NUL is ignored, keeping the previous ID."""
        assert run([b"id: 1\n\nid: a\x00b\ndata: x\n\n"])[0] == [SSEEvent(b"x", id="1")]

    def test_retry_digits_only_and_per_event(self) -> None:
        """'retry' is kept only when all ASCII digits, and belongs to its own event only."""
        stream = b"retry: 1500\ndata: a\n\nretry: 15a\ndata: b\n\nretry:\ndata: c\n\n"
        assert [e.retry for e in run([stream])[0]] == [1500, None, None]

    def test_huge_retry_does_not_raise(self) -> None:
        """A 'retry' with more digits than int() accepts is ignored rather than raising."""
        assert run([b"retry: " + b"9" * 10_000 + b"\ndata: x\n\n"])[0] == [SSEEvent(b"x")]

    def test_field_parsing(self) -> None:
        """No colon means empty value, only one space is stripped, later colons are kept,
        unknown fields and case variants are ignored."""
        stream = b"data\ndata:  two\ndata:a:b\nfoo: bar\nData: no\nDATA\n\n"
        assert run([stream])[0] == [SSEEvent(b"\n two\na:b")]

    def test_multiline_data_joined_with_lf(self) -> None:
        """Several data lines are joined with a single LF, with no trailing LF."""
        assert run([b"data: a\ndata: b\ndata: c\n\n"])[0] == [SSEEvent(b"a\nb\nc")]

    def test_leading_bom_skipped_even_when_split(self) -> None:
        """One leading UTF-8 BOM is skipped, also when it arrives a byte at a time."""
        stream = BOM + b"data: x\n\n"
        for chunks in modes(stream).values():
            assert run(chunks)[0] == [SSEEvent(b"x")]

    def test_only_one_bom_skipped(self) -> None:
        """A second BOM is part of the first field name, so that line is an unknown field."""
        assert run([BOM + BOM + b"data: x\n\ndata: y\n\n"])[0] == [SSEEvent(b"y")]


class TestLineEndings:
    @pytest.mark.parametrize(
        "stream",
        [
            b"data: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n",
            b"data: a\rdata: b\r\rdata: c\r\r",
            b"data: a\ndata: b\r\n\rdata: c\r\n\n",
        ],
        ids=["crlf", "cr", "mixed"],
    )
    def test_line_endings(self, stream: bytes) -> None:
        """CRLF, CR and mixed terminators frame identically in every chunking."""
        for chunks in modes(stream).values():
            assert run(chunks)[0] == [SSEEvent(b"a\nb"), SSEEvent(b"c")]

    def test_crlf_split_across_chunks_is_one_terminator(self) -> None:
        """A CR ending one chunk and a LF opening the next make one line break, not two."""
        events, _ = run([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"])
        assert events == [SSEEvent(b"a\nb")]

    def test_cr_then_cr_across_chunks_is_blank_line(self) -> None:
        """A CR ending a chunk followed by a CR is a line end plus a blank line."""
        assert run([b"data: a\r", b"\r"])[0] == [SSEEvent(b"a")]

    def test_trailing_cr_survives_empty_chunk(self) -> None:
        """An empty chunk between CR and LF does not break the CRLF pairing."""
        assert run([b"data: a\r", b"", b"\n", b"\n"])[0] == [SSEEvent(b"a")]

    @pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x1e", "\x85"])
    def test_unicode_separators_are_not_line_breaks(self, char: str) -> None:
        """U+2028 and other str.splitlines() separators stay inside the data."""
        data = f'{{"content":"a{char}b"}}'.encode()
        assert run([b"data: " + data + b"\n\n"])[0] == [SSEEvent(data)]


class TestComments:
    def test_pings_counted_not_dispatched(self) -> None:
        """':' and ': ping' keep-alives are counted as comments and dispatch nothing."""
        events, framer = run([b":\n\n: ping\n\ndata: x\n: inside\n\n"])
        assert events == [SSEEvent(b"x")]
        assert (framer.comments, framer.events) == (3, 1)
        assert framer.incomplete_at_eof is False


class TestUTF8:
    @pytest.mark.parametrize("text", ["é", "漢", "😀", "aé漢😀z"])
    def test_multibyte_split_at_every_boundary(self, text: str) -> None:
        """Data bytes are identical and decode correctly for every two- and three-way split."""
        stream = f"event: {text}\ndata: {text}\n\n".encode()
        expected = [SSEEvent(text.encode(), text)]
        for i in range(len(stream) + 1):
            assert run([stream[:i], stream[i:]])[0] == expected
            for j in range(i, len(stream) + 1):
                events, _ = run([stream[:i], stream[i:j], stream[j:]])
                assert events == expected
                assert events[0].data.decode() == text


class TestLargeAndOversized:
    @pytest.mark.parametrize("size", [65536, 65537, 4093, 1 << 20, (1 << 20) + 100])
    def test_one_mib_event_intact(self, size: int) -> None:
        """A 1 MiB event survives any chunk size intact under the default cap."""
        data = bytes(range(32, 127)) * (1 << 20 // 95 + 1)
        stream = b"data: " + data + b"\n\ndata: next\n\n"
        events, framer = run(by_size(stream, size))
        assert events == [SSEEvent(data), SSEEvent(b"next")]
        assert framer.oversized == 0

    @pytest.mark.parametrize("size", [0, 1, 7, 999, 1000, 1001])
    def test_oversized_event_dropped_next_frames(self, size: int) -> None:
        """An event over the cap is dropped and counted; the following event frames intact."""
        stream = b"data: ok1\n\ndata: " + b"x" * 2000 + b"\nevent: e\ndata: y\n\ndata: ok2\n\n"
        events, framer = run(by_size(stream, size) if size else [stream], cap=1000)
        assert events == [SSEEvent(b"ok1"), SSEEvent(b"ok2")]
        assert (framer.oversized, framer.events) == (1, 2)

    def test_many_small_data_lines_over_cap(self) -> None:
        """The cap counts all data of the event, not just one line."""
        stream = b"data: 0123456789\n" * 200 + b"\ndata: ok\n\n"
        for chunks in ([stream], by_size(stream, 13)):
            events, framer = run(chunks, cap=1000)
            assert events == [SSEEvent(b"ok")]
            assert framer.oversized == 1

    def test_cap_boundary(self) -> None:
        """A line of exactly max_event_bytes (field name included) is kept; one more is not."""
        for chunks_of in (lambda s: [s], lambda s: by_size(s, 1)):
            kept, _ = run(chunks_of(b"data: " + b"a" * 94 + b"\n\n"), cap=100)
            dropped, f = run(chunks_of(b"data: " + b"a" * 95 + b"\n\n"), cap=100)
            assert (kept, dropped, f.oversized) == ([SSEEvent(b"a" * 94)], [], 1)

    def test_never_ending_line_stays_bounded(self) -> None:
        """A line that never ends keeps `buffered` under the cap; framing resumes after it."""
        framer = SSEFramer(max_event_bytes=1000)
        assert framer.feed(b"data: ") == []
        for _ in range(5000):
            assert framer.feed(b"z" * 97) == []
            assert framer.buffered <= 1000
        assert framer.feed(b"\n\ndata: ok\n\n") == [SSEEvent(b"ok")]
        assert (framer.oversized, framer.buffered) == (1, 0)


class TestFlush:
    @pytest.mark.parametrize("tail", [b"data: x\n", b"data: x", b"id: 3\n", b": partial"])
    def test_incomplete_event_discarded_and_flagged(self, tail: bytes) -> None:
        """An event or line cut off at EOF is discarded, flush() returns [] and flags it."""
        framer = SSEFramer()
        assert framer.feed(b"data: a\n\n" + tail) == [SSEEvent(b"a", id=None)]
        assert framer.flush() == []
        assert framer.incomplete_at_eof is True
        assert framer.buffered == 0

    @pytest.mark.parametrize("tail", [b"", b":\n\n", b": ping\n", b"\n\n"])
    def test_clean_end_not_flagged(self, tail: bytes) -> None:
        """A stream ending on an event boundary or a finished comment is not flagged."""
        _, framer = run([b"data: a\n\n" + tail])
        assert framer.incomplete_at_eof is False


def _chunk(delta: dict[str, object], finish: str | None = None, **extra: object) -> bytes:
    body = {
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
        "created": 1732950000,
        "id": "chatcmpl-Xq1",
        "model": "qwen2.5-7b-instruct",
        "system_fingerprint": "b4200-2803540",
        "object": "chat.completion.chunk",
        **extra,
    }
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


LLAMA_STREAM = b"\n\n".join(
    [
        _chunk({"role": "assistant", "content": None}),
        _chunk({"content": "Hel"}),
        _chunk({"content": "lo é漢😀\u2028!"}),
        b":",
        _chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                    }
                ]
            }
        ),
        _chunk(
            {},
            "tool_calls",
            usage={"completion_tokens": 12, "prompt_tokens": 80, "total_tokens": 92},
            timings={
                "prompt_n": 80,
                "prompt_ms": 41.2,
                "predicted_n": 12,
                "predicted_ms": 150.3,
                "predicted_per_second": 79.8,
            },
        ),
        b"data: [DONE]",
        b"",
    ]
)


class TestLlamaServer:
    def test_realistic_stream(self) -> None:
        """A llama-server chat stream yields each chunk's JSON verbatim, then [DONE]."""
        events, framer = run([LLAMA_STREAM])
        assert [e.data for e in events][-1] == b"[DONE]"
        payloads = [json.loads(e.data) for e in events[:-1]]
        assert payloads[2]["choices"][0]["delta"]["content"] == "lo é漢😀\u2028!"
        assert payloads[3]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"]
        assert payloads[4]["timings"]["predicted_n"] == 12
        assert (framer.events, framer.comments, framer.incomplete_at_eof) == (6, 1, False)
        rebuilt = b"".join(b"data: " + e.data + b"\n\n" for e in events)
        assert rebuilt == LLAMA_STREAM.replace(b":\n\n", b"")

    @pytest.mark.parametrize("size", [1, 2, 3, 5, 16, 64, 100, 257, 1000])
    def test_realistic_stream_any_chunk_size(self, size: int) -> None:
        """Re-chunking the llama-server stream changes neither events nor counters."""
        whole, f1 = run([LLAMA_STREAM])
        chunked, f2 = run(by_size(LLAMA_STREAM, size))
        assert chunked == whole
        assert counters(f2) == counters(f1)

    @pytest.mark.parametrize(
        "chunks",
        [
            [BOM + b"data: a\n\n", b"data: b\n\n"],  # the first chunk settles the BOM
            [b"id: 7\n\n", b"data: a\n\n", b"data:b\n\n"],  # the last id is kept
            [b"event: x\n", b"data: a\n\n", b"data: b\n\n"],  # inside an event: a line
            [b"data: a\n", b"data: b\n\n", b"data: c\n\n"],  # a second data line
            [b"data: a", b"data: b\n\n", b"data: c\n\n"],  # the end of an open line
            [b"data: a\r", b"\ndata: b\n\n", b"data: c\n\n"],  # a CRLF cut in two
            [b"data: a\r\n\r\n", b"data: b\r\n\r\n"],  # CRLF events
            [b"data: 0123456789\n\n", b"data: b\n\n"],  # over the cap: dropped
            [b": ping\n\n", b"data: a\n\n", b"retry: 5\n\n", b"data: b\n\n"],
            [b"data: a\n\n", bytearray(b"data: b\n\n"), b"data: c\n\n"],  # not bytes
        ],
    )
    def test_chunks_of_one_whole_event_frame_as_the_stream_does(self, chunks: list[bytes]) -> None:
        """A chunk that is exactly one ``data:`` event (how llama-server writes) frames to
        the same events and counters as the stream fed whole, whatever came before it."""
        whole, f1 = run([b"".join(chunks)], cap=12)
        chunked, f2 = run(chunks, cap=12)
        assert chunked == whole
        assert counters(f2) == counters(f1)

    @pytest.mark.parametrize(
        "chunk", [b"data: a\n\n", b"data:a\n\n", b"data:\n\n", b"data: \n\n", b"data:  a\n\n"]
    )
    def test_whole_gives_the_data_feed_gives_for_a_chunk_of_one_event(self, chunk: bytes) -> None:
        """After the first chunk, ``whole`` returns the data ``feed`` dispatches for a chunk
        of exactly one one-line ``data:`` event (one space after the colon dropped, no
        other), and counts the event."""
        fed, f1 = run([b"data: x\n\n", chunk])
        f2 = SSEFramer()
        f2.feed(b"data: x\n\n")
        assert f2.whole(chunk) == fed[-1].data
        assert counters(f2) == counters(f1)

    @pytest.mark.parametrize(
        "chunk",
        [
            b"",
            b"\n\n",
            b"data: a\n",  # no blank line
            b"data: a\nb",  # one LF, one byte after it
            b"data: a\n\ndata: b\n\n",  # two events
            b"data: a\nid: 1\n\n",  # two lines
            b"id: 1\n\n",  # no data field
            b"data: a\r\n\r\n",  # CR line ends
            b"data: a\rb\n\n",  # a CR inside
            b"data: 0123456789abc\n\n",  # over the cap (12 bytes)
            bytearray(b"data: a\n\n"),  # not bytes
        ],
    )
    def test_whole_leaves_every_other_chunk_to_feed(self, chunk: bytes) -> None:
        """``whole`` returns None and changes nothing for a chunk that is not exactly one
        whole one-line ``data:`` event without CR, within the cap; then ``feed`` frames it
        as the stream fed whole would."""
        _, f = run([b"data: x\n\n"], cap=12)
        before = counters(f)
        assert f.whole(chunk) is None
        assert counters(f) == before
        assert f.feed(chunk) == run([b"data: x\n\n" + bytes(chunk)], cap=12)[0][1:]

    def test_whole_leaves_the_first_chunk_to_feed(self) -> None:
        """The first chunk of a stream goes to ``feed`` (it may open with a BOM), even when
        it is one whole event."""
        f = SSEFramer()
        assert f.whole(b"data: a\n\n") is None
        assert f.events == 0


# --- property tests --------------------------------------------------------------------

_SPECIAL = st.sampled_from(["\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x85", "é", "漢", "😀"])
_TEXT = st.text(
    st.one_of(st.characters(codec="utf-8", exclude_characters="\r\n"), _SPECIAL), max_size=12
)
_EOL = st.sampled_from(["\n", "\r\n", "\r"])
_SSEISH = st.lists(
    st.sampled_from(
        [
            b"data",
            b"event",
            b"id",
            b"retry",
            b":",
            b": ",
            b" ",
            b"\r",
            b"\n",
            b"\r\n",
            b"x",
            b"7",
            b"\x00",
            BOM,
            b"\xe6\xbc",
            b"\xa2",
            b"\xff",
        ]
    ),
    max_size=60,
).map(b"".join)


@st.composite
def event_streams(draw: st.DrawFn) -> tuple[bytes, list[SSEEvent], int]:
    """A serialised stream of random events with its expected events and comment count."""
    lines: list[str] = []
    expected: list[SSEEvent] = []
    last_id: str | None = None
    comments = 0
    for _ in range(draw(st.integers(0, 6))):
        block = [f"data: {d}" for d in draw(st.lists(_TEXT, min_size=1, max_size=4))]
        name = draw(st.none() | _TEXT)
        if name is not None:
            block.insert(draw(st.integers(0, len(block))), f"event: {name}")
        new_id = draw(st.none() | _TEXT.filter(lambda s: "\x00" not in s))
        if new_id is not None:
            block.insert(draw(st.integers(0, len(block))), f"id: {new_id}")
            last_id = new_id
        for note in draw(st.lists(_TEXT, max_size=2)):
            block.insert(draw(st.integers(0, len(block))), f":{note}")
            comments += 1
        lines += [*block, ""]
        data = "\n".join(line[6:] for line in block if line.startswith("data: "))
        expected.append(SSEEvent(data.encode(), name or "message", last_id))
    out, prev = [], ""
    for line in lines:
        eol = draw(_EOL)
        if not line and prev == "\r" and eol == "\n":
            eol = "\r\n"  # CR then LF would merge into one CRLF and swallow the blank line
        out.append(line + eol)
        prev = eol
    return "".join(out).encode(), expected, comments


def _splits(data: st.DataObject, stream: bytes) -> list[bytes]:
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    return split_at(stream, points)


class TestProperties:
    @settings(max_examples=examples(300), deadline=None)
    @given(event_streams(), st.data())
    def test_events_roundtrip_under_any_chunking(
        self, case: tuple[bytes, list[SSEEvent], int], data: st.DataObject
    ) -> None:
        """Serialised random events come back exactly, whole or re-chunked anywhere."""
        stream, expected, comments = case
        whole, f1 = run([stream])
        assert whole == expected
        assert (f1.comments, f1.incomplete_at_eof) == (comments, False)
        chunked, f2 = run(_splits(data, stream))
        assert chunked == expected
        assert counters(f2) == counters(f1)

    @settings(max_examples=examples(300), deadline=None)
    @given(st.one_of(st.binary(max_size=200), _SSEISH), st.data())
    def test_arbitrary_bytes_match_reference_and_chunking(
        self, stream: bytes, data: st.DataObject
    ) -> None:
        """Arbitrary bytes never raise, match the spec-literal oracle, and ignore chunking."""
        whole, f1 = run([stream])
        assert (whole, f1.comments) == oracle(stream)
        chunked, f2 = run(_splits(data, stream))
        assert chunked == whole
        assert counters(f2) == counters(f1)

    @settings(max_examples=examples(300), deadline=None)
    @given(_SSEISH, st.integers(1, 24), st.data())
    def test_small_cap_chunking_invariant_and_bounded(
        self, stream: bytes, cap: int, data: st.DataObject
    ) -> None:
        """With a tiny cap, oversize drops do not depend on chunking and memory stays capped."""
        whole, f1 = run([stream], cap=cap)
        framer = SSEFramer(max_event_bytes=cap)
        chunked: list[SSEEvent] = []
        for chunk in _splits(data, stream):
            chunked += framer.feed(chunk)
            assert framer.buffered <= max(cap, len(BOM) - 1)  # an undecided BOM prefix
        chunked += framer.flush()
        assert chunked == whole
        assert counters(framer) == counters(f1)
        assert all(len(e.data) <= cap for e in whole)
