"""Fault injection on the records' way out and on the process's signals.

The log lines (one record per request) go to ``--log-file`` and stdout
(:mod:`proxy.serve.log_outputs`): a closed or broken stdout, a disk that fills up after the
start or is full at it, must never lose a record in silence, nor stop the file or the start.
``SIGHUP`` (logrotate's ``postrotate kill -HUP``) reopens the file instead of ending the
process. SIGTERM ends the process within ``shutdown_drain_s`` plus
:data:`proxy.serve.app.SHUTDOWN_AFTER_DRAIN_S`, the cut stream's record written.

The process tests run ``python -m proxy serve`` in front of the fake llama-server, as
tests/serve/test_faults.py does; a full disk is ``/dev/full`` (every write fails with ENOSPC) at the
start and ``RLIMIT_FSIZE`` after it (writes past the limit fail with EFBIG, the last one cut
short, exactly as on a disk that fills up: Python ignores SIGXFSZ).
"""

from __future__ import annotations

import asyncio
import errno
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import structlog
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from proxy.commands.ports import free_port
from proxy.config import BoardConfig
from proxy.core.record import Kind, Outcome, Record
from proxy.core.request import RequestFacts
from proxy.core.roofline import Board
from proxy.core.stats import Stats
from proxy.serve import logs
from proxy.serve.app import SHUTDOWN_AFTER_DRAIN_S
from proxy.serve.log_outputs import WARN_EVERY_S, Output
from proxy.serve.logs import configure_logging, dropped_lines, get_logger
from proxy.serve.metrics import Metrics
from proxy.serve.model_info import ModelInfo
from proxy.serve.sinks import RecordSinks
from proxy.serve.tasks import spawn
from tests.conftest import PROXY_START_S, Captured
from tests.fakes import DONE, FakeClock, FakeUpstream, json_response, slow_steady
from tests.serve.test_faults import CHAT_BODY, NO_MODELS, routed

Fake = tuple[FakeUpstream, TestServer]

HOST = "127.0.0.1"
PLAIN = json_response(200, b'{"choices":[{"message":{"role":"assistant","content":"hi"}}]}')
CHAT = "/v1/chat/completions"
PLAIN_BODY = orjson.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
LIMITED = (
    "import os, resource, sys\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
"""``python -c LIMITED BYTES ARGV...``: run ARGV with files limited to BYTES (a disk that
fills up once the log file reaches that size)."""
NEEDS_DEV_FULL = pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")


# --------------------------------------------------------------------------------------------
# The proxy as a process


@dataclass
class Serving:
    """A running ``python -m proxy serve``: its URLs, its log file, its process."""

    proc: asyncio.subprocess.Process
    url: str
    admin: str
    log_file: Path
    stderr_file: Path
    stderr: bytes = b""
    terminated_at: float | None = None
    took_s: float | None = None
    """Seconds from SIGTERM to exit (set by :meth:`stop`)."""

    def terminate(self) -> None:
        """SIGTERM, once: a second one during the drain would end it (aiohttp's GracefulExit
        raised again, exit code 1), as a second Ctrl-C does."""
        if self.terminated_at is None:
            self.terminated_at = time.monotonic()
            self.proc.send_signal(signal.SIGTERM)

    def events(self, path: Path | None = None) -> list[dict[str, Any]]:
        """The whole lines of the log file (or ``path``), parsed: a line the proxy is still
        writing, or one a write failure cut short, is not a line yet."""
        text = (path or self.log_file).read_bytes()
        return [json.loads(line) for line in text[: text.rfind(b"\n") + 1].splitlines()]

    def records(self, path: Path | None = None) -> list[dict[str, Any]]:
        """The ``request_completed`` lines of the log file (or ``path``)."""
        return [e for e in self.events(path) if e["event"] == "request_completed"]

    async def wait_records(self, count: int, path: Path | None = None) -> list[dict[str, Any]]:
        """Wait until the file holds ``count`` records (each is written when its exchange
        ends)."""
        for _ in range(500):
            found = self.records(path)
            if len(found) >= count:
                return found
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(self.records(path))} records in {path}, wanted {count}")

    async def dropped(self) -> dict[str, float]:
        """``timing_proxy_records_dropped_total`` by sink, from the admin listener."""
        async with aiohttp.ClientSession() as client, client.get(self.admin + "/metrics") as r:
            text = await r.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        family = families["timing_proxy_records_dropped"]
        return {s.labels["sink"]: s.value for s in family.samples if s.name.endswith("_total")}

    async def stop(self) -> int:
        """SIGTERM unless sent already, and the exit code (stderr is kept in :attr:`stderr`,
        the seconds from SIGTERM to exit in :attr:`took_s`)."""
        if self.proc.returncode is None:
            self.terminate()
        rc = await asyncio.wait_for(self.proc.wait(), timeout=20)
        if self.terminated_at is not None:
            self.took_s = time.monotonic() - self.terminated_at
        self.stderr = self.stderr_file.read_bytes()
        return rc

    def stderr_lines(self) -> list[str]:
        return self.stderr.decode().splitlines()


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Any]:
    """Start ``python -m proxy serve`` (``prefix`` before it: a wrapper that changes its
    process), in front of an upstream; killed after the test if still running."""
    started: list[Serving] = []

    async def start(
        upstream: str,
        *,
        stdout: int = asyncio.subprocess.DEVNULL,
        prefix: Sequence[str] = (),
        config: str = "",
        log_file: str | None = None,
        wait: bool = True,
    ) -> Serving:
        port, admin_port = free_port(HOST), free_port(HOST)
        config_file = tmp_path / "config.toml"
        config_file.write_text(config)
        log = Path(log_file) if log_file is not None else tmp_path / "requests.jsonl"
        stderr_file = tmp_path / f"stderr-{len(started)}.txt"
        with stderr_file.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *prefix,
                *(sys.executable, "-m", "proxy", "serve", "--config", str(config_file)),
                *("--listen", f"{HOST}:{port}", "--admin-listen", f"{HOST}:{admin_port}"),
                *("--upstream", upstream, "--log-file", str(log)),
                stdout=stdout,
                stderr=stderr,
                cwd=Path(__file__).parents[2],
                env={**os.environ},
            )
        url, admin = f"http://{HOST}:{port}", f"http://{HOST}:{admin_port}"
        serving = Serving(proc, url, admin, log, stderr_file)
        started.append(serving)
        if wait:
            await _wait_ready(serving)
        return serving

    yield start
    for serving in started:
        if serving.proc.returncode is None:
            serving.proc.kill()
            await serving.proc.wait()


async def _wait_ready(serving: Serving) -> None:
    """Until the admin listener answers (it waits for the agent's listener)."""
    deadline = time.monotonic() + PROXY_START_S
    async with aiohttp.ClientSession() as client:
        while time.monotonic() < deadline:
            try:
                async with client.get(serving.admin + "/stats") as ready:
                    if ready.status == 200:
                        return
            except aiohttp.ClientConnectorError:
                pass
            assert serving.proc.returncode is None, serving.stderr_file.read_text()
            await asyncio.sleep(0.05)
    raise AssertionError(f"the proxy did not answer /stats within {PROXY_START_S:.0f} s")


async def _send(url: str, count: int) -> list[str]:
    """``count`` plain chat requests, one after the other; their request ids."""
    ids = []
    async with aiohttp.ClientSession() as client:
        for _ in range(count):
            async with client.post(url + "/v1/chat/completions", data=PLAIN_BODY) as resp:
                assert resp.status == 200
                await resp.read()
                ids.append(resp.headers["X-Timing-Proxy-Request-Id"])
    return ids


async def _counted(serving: Serving, wanted: int) -> int:
    """/stats's request count, once it reached ``wanted`` (or after 5 s)."""
    count = 0
    async with aiohttp.ClientSession() as client:
        for _ in range(500):
            async with client.get(serving.admin + "/stats") as resp:
                count = int((await resp.json())["requests"])
            if count >= wanted:
                break
            await asyncio.sleep(0.01)
    return count


def _warnings(lines: list[str]) -> list[dict[str, Any]]:
    """stderr's lines, every one of them a ``records_dropped`` warning (else it fails)."""
    parsed = [json.loads(line) for line in lines]
    assert all(w["event"] == "records_dropped" and w["level"] == "warning" for w in parsed), lines
    return parsed


def _url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


# ============================================================================================
# 1. Records lost without a count: stdout, a full disk


class TestStdout:
    """A closed or broken stdout stops neither the start nor the file, and is counted."""

    @pytest.mark.parametrize("how", ["closed", "broken"])
    async def test_a_dead_stdout_at_start_stops_neither_the_start_nor_the_file(
        self, fake: Fake, serve: Any, how: str
    ) -> None:
        """With stdout closed (``>&-``) or a pipe nobody reads any more (``| head`` gone),
        the proxy starts, every record reaches the file, and each line stdout could not take
        is counted on /metrics and said in at most two stderr lines (the first drop, then
        the rest at exit), never a traceback."""
        upstream, server = fake
        upstream.script = routed({CHAT: PLAIN}, NO_MODELS)
        if how == "closed":
            serving = await serve(_url(server), prefix=("sh", "-c", 'exec "$@" >&-', "sh"))
        else:
            read_end, write_end = os.pipe()
            os.close(read_end)
            try:
                serving = await serve(_url(server), stdout=write_end)
            finally:
                os.close(write_end)
        ids = await _send(serving.url, 10)
        records = await serving.wait_records(10)
        assert [r["id"] for r in records] == ids
        assert (await serving.dropped())["stdout"] >= 10
        assert await serving.stop() == 0
        warnings = _warnings(serving.stderr_lines())
        assert 1 <= len(warnings) <= 2 and {w["sink"] for w in warnings} == {"stdout"}
        # every line the file holds is one stdout dropped, and each was said
        assert sum(w["dropped"] for w in warnings) == len(serving.events())
        assert warnings[-1]["dropped_total"] == len(serving.events())

    async def test_stdout_breaking_later_loses_no_record_in_the_file(
        self, fake: Fake, serve: Any
    ) -> None:
        """stdout read, then its reader gone: the ten records after it all reach the file,
        /metrics counts the ten stdout dropped, and stderr has one warning, not a
        traceback per record."""
        upstream, server = fake
        upstream.script = routed({CHAT: PLAIN}, NO_MODELS)
        read_end, write_end = os.pipe()
        try:
            serving = await serve(_url(server), stdout=write_end)
        finally:
            os.close(write_end)
        read = os.read(read_end, 65536)  # proxy_started (the upstream check's line, maybe)
        os.close(read_end)
        assert read.startswith(b'{"listen"') and b'"event":"proxy_started"' in read
        ids = await _send(serving.url, 10)
        records = await serving.wait_records(10)
        assert [r["id"] for r in records] == ids
        dropped = await serving.dropped()
        assert dropped["file"] == 0 and dropped["stdout"] >= 10
        assert await serving.stop() == 0
        warnings = _warnings(serving.stderr_lines())
        assert len(warnings) == 2  # the first drop at once; the rest, within the minute, at exit
        assert warnings[0]["dropped"] == 1 and warnings[0]["cause"] == "Broken pipe"
        # every line the file has and stdout's reader did not get was counted and said
        lost = len(serving.events()) - read.count(b"\n")
        assert warnings[-1]["dropped_total"] == lost == sum(w["dropped"] for w in warnings)


class TestFullDisk:
    """A disk full at the start stops it in one line; one that fills later costs counted
    lines, never the relay, the other sinks, or a traceback."""

    @pytest.mark.parametrize(
        "where",
        [
            pytest.param("/dev/full", marks=NEEDS_DEV_FULL),
            "not-a-dir/requests.jsonl",
        ],
    )
    async def test_an_unwritable_log_file_at_start_is_one_line_naming_it(
        self, fake: Fake, serve: Any, tmp_path: Path, where: str
    ) -> None:
        """A log file that takes no line (a full disk: /dev/full) or cannot be opened stops
        ``serve`` with exit code 2 and one stderr line naming the file and the cause."""
        if where != "/dev/full":
            (tmp_path / "not-a-dir").write_text("a file")
            where = str(tmp_path / where)
        _, server = fake
        serving = await serve(_url(server), log_file=where, wait=False)
        assert await asyncio.wait_for(serving.proc.wait(), timeout=20) == 2
        assert await serving.stop() == 2
        (line,) = serving.stderr_lines()
        assert line.startswith(f"timing-proxy: error: {where}: ")
        cause = "No space left on device" if where == "/dev/full" else "Not a directory"
        assert line.endswith(cause)

    async def test_a_disk_filling_up_drops_lines_counted_and_said_once(
        self, fake: Fake, serve: Any
    ) -> None:
        """The file may grow to 8 KiB only: the proxy keeps relaying and counting (/stats has
        every request), every line is either whole in the file or counted as dropped (stdout
        has them all), no two lines run together, and stderr has the first drop and the rest
        at exit, naming the file, without a traceback."""
        upstream, server = fake
        upstream.script = routed({CHAT: PLAIN}, NO_MODELS)
        serving = await serve(
            _url(server),
            prefix=(sys.executable, "-c", LIMITED, str(8192)),
            stdout=asyncio.subprocess.PIPE,
        )
        assert serving.proc.stdout is not None
        reading: set[asyncio.Future[Any]] = set()
        stdout = spawn(serving.proc.stdout.read(), reading)
        ids = await _send(serving.url, 30)
        assert await _counted(serving, 30) == 30  # records are handed off after the reply
        dropped = await serving.dropped()
        assert dropped["stdout"] == 0 and dropped["file"] > 0
        assert await serving.stop() == 0
        on_stdout = (await stdout).splitlines()
        assert {json.loads(line)["id"] for line in on_stdout if b"request_completed" in line} == (
            set(ids)
        )
        in_file = serving.events()  # each whole line parses: none ran into another
        assert 0 < len(serving.records()) < 30
        warnings = _warnings(serving.stderr_lines())
        assert len(warnings) == 2
        assert {w["path"] for w in warnings} == {str(serving.log_file)}
        assert warnings[0]["cause"] == "File too large"
        assert len(in_file) + warnings[-1]["dropped_total"] == len(on_stdout)


@pytest.fixture
def failing_stdout() -> Iterator[Any]:
    """structlog configured by :func:`configure_logging` onto a stdout that fails every
    write; the set-up in force before is restored after."""
    saved, saved_direct = structlog.get_config(), logs._direct
    configure_logging("info", stream=_Disk(room=0))
    try:
        yield
    finally:
        structlog.configure(**saved)
        logs._direct = saved_direct


def test_a_failing_log_line_skips_no_sink_after_it(failing_stdout: None) -> None:
    """Every record still reaches the sinks after the log line (setup findings, spans; here a
    capture) while its line cannot be written, and each line is counted."""
    captured = Captured()
    metrics = Metrics()
    board = Board.from_config(BoardConfig())
    sinks = RecordSinks(
        Stats(since="2026-12-01T00:00:00Z"),
        metrics,
        ModelInfo("http://127.0.0.1:1", board),
        get_logger(),
        threading.Lock(),
    )
    sinks.sinks.append(captured.sink)
    for i in range(5):
        sinks(Record(id=str(i), ts=None, method="POST", path="/v1/chat/completions"), _FACTS, None)
    assert [r.id for r in captured.records] == ["0", "1", "2", "3", "4"]
    assert dropped_lines() == {"stdout": 5}
    page = metrics.render(None).decode()
    assert 'timing_proxy_records_dropped_total{sink="stdout"} 5.0' in page


_FACTS = RequestFacts(kind=Kind.CHAT, stream=False)


# --------------------------------------------------------------------------------------------
# One output, with a fake stream and a fake clock


class _Disk(io.BytesIO):
    """A stream with ``room`` bytes left: a write takes what fits, then fails with ENOSPC."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, data: Any) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = bytes(data[: self.room])
        self.room -= len(taken)
        return super().write(taken)


def _said(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


class TestOutput:
    """What one output does with a failing stream: retry, count, say, keep lines apart."""

    def test_drops_are_said_at_most_once_a_minute_with_the_count_since_the_last(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The first drop is said at once; the next ones within the minute are not, the
        first one after it says all of them, and closing says the rest."""
        clock = FakeClock()
        out = Output("file", _Disk(room=0), "/data/requests.jsonl", clock=clock)
        assert out.write(b"{}\n") is False
        (first,) = _said(capsys)
        assert (first["sink"], first["path"], first["dropped"]) == (
            "file",
            "/data/requests.jsonl",
            1,
        )
        assert first["cause"] == "No space left on device"
        for second in range(1, 60):
            clock.now = second
            out.write(b"{}\n")
        assert _said(capsys) == []
        clock.now = WARN_EVERY_S
        out.write(b"{}\n")
        (again,) = _said(capsys)
        assert (again["dropped"], again["dropped_total"]) == (60, 61)
        clock.advance(1)
        out.write(b"{}\n")
        assert _said(capsys) == []
        out.close()
        (last,) = _said(capsys)
        assert (last["dropped"], last["dropped_total"]) == (1, 62)
        assert out.dropped == 62

    def test_nothing_is_said_while_writes_succeed(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Lines written whole count nothing and say nothing, closing included."""
        disk = _Disk(room=1000)
        out = Output("file", disk, "/data/requests.jsonl")
        assert all(out.write(b'{"n":%d}\n' % i) for i in range(10))
        out.close()
        assert out.dropped == 0 and capsys.readouterr().err == ""

    def test_a_failed_write_is_retried_once(self) -> None:
        """A write that fails once (EAGAIN, EINTR) is written by the retry, not dropped."""

        class Once(_Disk):
            failed = False

            def write(self, data: Any) -> int:
                if not self.failed:
                    self.failed = True
                    raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
                return super().write(data)

        disk = Once(room=100)
        out = Output("stdout", disk)
        assert out.write(b"{}\n") is True
        assert disk.getvalue() == b"{}\n" and out.dropped == 0

    def test_a_line_cut_short_is_ended_before_the_next(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A line the disk cut short is dropped, and once there is room again the next line
        starts on a line of its own: two lines never run together."""
        disk = _Disk(room=5)
        out = Output("file", disk, "/data/requests.jsonl")
        assert out.write(b'{"first":1}\n') is False
        disk.room = 1000
        assert out.write(b'{"second":2}\n') is True
        assert disk.getvalue() == b'{"fir\n{"second":2}\n'
        assert out.dropped == 1
        capsys.readouterr()

    def test_the_files_first_line_must_be_written(self) -> None:
        """Until the file took one line, a failure raises an OSError naming it (the start
        stops); after one, failures are counted."""
        out = Output("file", _Disk(room=0), "/data/requests.jsonl", must_start=True)
        with pytest.raises(OSError) as raised:
            out.write(b"{}\n")
        assert raised.value.filename == "/data/requests.jsonl"
        assert raised.value.errno == errno.ENOSPC
        disk = _Disk(room=3)
        started = Output("file", disk, "/data/requests.jsonl", must_start=True)
        assert started.write(b"{}\n") is True
        assert started.write(b"{}\n") is False and started.dropped == 1


# ============================================================================================
# 2. SIGHUP: logrotate


@pytest.mark.slow  # a 1.5 s stream in flight across the rotation, in a process of its own
async def test_sighup_reopens_the_log_file_and_loses_no_record(fake: Fake, serve: Any) -> None:
    """logrotate renames the file, then ``kill -HUP``: the proxy keeps running, the records
    before go to the renamed file, those after (the stream in flight at the signal
    included, relayed whole) to a new file at the path, none lost; nothing on stderr and
    nothing dropped (an ordinary run stays silent)."""
    upstream, server = fake
    upstream.script = routed({"/v1/completions": slow_steady(30, 0.05), CHAT: PLAIN}, NO_MODELS)
    serving = await serve(_url(server))
    before = await _send(serving.url, 3)
    await serving.wait_records(3)
    async with (
        aiohttp.ClientSession() as client,
        client.post(serving.url + "/v1/completions", data=CHAT_BODY) as stream,
    ):
        got = await stream.content.readany()
        rotated = serving.log_file.with_name("requests.jsonl.1")
        serving.log_file.rename(rotated)
        serving.proc.send_signal(signal.SIGHUP)
        for _ in range(500):  # the new file says it was opened
            if serving.log_file.exists() and serving.events():
                break
            await asyncio.sleep(0.01)
        assert serving.proc.returncode is None, "the proxy ended on SIGHUP"
        assert [e["event"] for e in serving.events()] == ["log_file_reopened"]
        after = await _send(serving.url, 3)
        got += await stream.read()
        stream_id = stream.headers["X-Timing-Proxy-Request-Id"]
    assert got.endswith(DONE)
    new = await serving.wait_records(4)
    assert [r["id"] for r in serving.records(rotated)] == before
    assert {r["id"] for r in new} == {*after, stream_id}
    (streamed,) = [r for r in new if r["id"] == stream_id]
    assert streamed["outcome"] == "completed"
    assert await serving.dropped() == {"file": 0, "stdout": 0}
    assert await serving.stop() == 0
    assert serving.stderr == b""
    assert serving.events()[-1]["event"] == "proxy_stopped"


# ============================================================================================
# 3. Shutdown within the drain


@pytest.mark.slow  # a 3 s drain: longer than SHUTDOWN_AFTER_DRAIN_S, so a double wait shows
async def test_shutdown_ends_within_the_drain_plus_the_constant(fake: Fake, serve: Any) -> None:
    """With a stream that never ends and a 3 s drain, SIGTERM ends the process within
    3 s + SHUTDOWN_AFTER_DRAIN_S (aiohttp alone waits the drain twice), after the stream
    had the drain; the stream is cut without a clean end and its record written."""
    drain = 3.0
    upstream, server = fake
    upstream.script = routed({CHAT: slow_steady(10**6, 0.05, done=False)}, NO_MODELS)
    serving = await serve(_url(server), config=f"[server]\nshutdown_drain_s = {drain}\n")
    async with (
        aiohttp.ClientSession() as client,
        client.post(serving.url + CHAT, data=CHAT_BODY) as stream,
    ):
        assert await stream.content.readany()
        serving.terminate()
        with pytest.raises(aiohttp.ClientPayloadError):
            async for _ in stream.content.iter_any():
                pass
        assert serving.terminated_at is not None
        cut_s = time.monotonic() - serving.terminated_at
        stream_id = stream.headers["X-Timing-Proxy-Request-Id"]
    assert await serving.stop() == 0
    took = serving.took_s
    assert took is not None and took < drain + SHUTDOWN_AFTER_DRAIN_S, (
        f"exit {took:.2f} s after SIGTERM"
    )
    assert cut_s > 0.8 * drain, f"the stream was cut {cut_s:.2f} s into a {drain} s drain"
    (record,) = serving.records()
    assert record["id"] == stream_id and record["outcome"] == Outcome.SHUTDOWN_ABORTED
    assert serving.events()[-1]["event"] == "proxy_stopped"
    assert serving.stderr == b""
