"""Load and soak tests: the proxy as its own process between aiohttp clients and a fast upstream.

Like production, the proxy runs as ``python -m proxy serve --listen ... --upstream ...
--log-file ...`` (its stdout, one JSON line per request, goes to /dev/null; the log file is
kept, that is the production cost). The upstream is a small aiohttp app in another process
(``python -m tests.test_load upstream PORT_FILE``) that streams llama-shaped events with a
small pause between them, so streams overlap, and answers non-stream requests with JSON.

* ``test_concurrent_streams``: 200 concurrent streams for a bounded time.
* ``test_soak``: many short stream and non-stream requests at concurrency 50.

Both check: every client got exactly the upstream's bytes, every request is recorded
(``request_completed`` lines in the log file and ``/stats`` ``requests``), ``/stats``
answers every poll during the load and after it with a correct document (polled from its own
process, next to a trivial path of the same admin listener to tell the listener's queueing
from the ``/stats`` work), and the proxy's RSS (``/proc/PID/status`` VmRSS) stays flat: at
most 30 MB over the start (after a warm-up), and no growth once the ``/stats`` windows are
full (the streams go on until at least three RSS samples are taken after that point). The
``/stats`` latencies are printed as ``[load] ...`` lines but only bounded functionally (10
s): on a shared 2-core machine they measure the machine's other load as much as the proxy;
``bench/stats_stall.py`` measures the ``/stats`` build's stall of the event loop. CI runs a
bounded version (about 60 s of streams, 20,000 soak requests); ``TIMING_PROXY_SOAK=full``
runs 5 minutes of streams and 100,000 soak requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.commands.ports import free_port
from tests.fakes import DONE, SSE_HEADERS, chat_event, load_recording, make_timings
from tests.terminal import terminal_log

pytestmark = pytest.mark.load

FULL = os.environ.get("TIMING_PROXY_SOAK") == "full"
REPO = Path(__file__).resolve().parent.parent

STREAMS = 200
STREAM_SECONDS = float(os.environ.get("TIMING_PROXY_LOAD_SECONDS") or (300 if FULL else 50))
STREAM_EVENTS = 16  # tokens per stream
STREAM_GAP_MS = int(os.environ.get("TIMING_PROXY_LOAD_GAP_MS") or 5)  # between two events
SOAK_REQUESTS = 100_000 if FULL else 20_000
SOAK_CONCURRENCY = 50
SOAK_EVENTS = 4  # tokens per soak stream, no pause
#: a functional bound, not a figure: every /stats poll, under load or after it, answers a
#: correct document within this time. The admin listener has a thread of its own, but it
#: shares the GIL and two cores with the streams, and on a shared machine the latency measures
#: the machine's other load as much as the proxy: the figures are printed (docs/performance.md
#: quotes them), bench/stats_stall.py measures the build's stall of the relay
STATS_ANSWER_S = 10.0
RSS_SLACK_MB = 30.0
#: the log events of a healthy run: the start, the upstream check at start, the records
EXPECTED_EVENTS = frozenset({"proxy_started", "upstream_ok", "request_completed"})
#: the /stats windows hold 10,000 records per kind; RSS samples after this many requests
#: show whether memory still grows once they are full, and at least this many are needed
SETTLED_AFTER = 12_000
SETTLED_SAMPLES = 3
RSS_SAMPLE_S = 5.0
#: the stream test goes on past STREAM_SECONDS (at most this much longer) until it has
#: SETTLED_SAMPLES RSS samples after SETTLED_AFTER requests
STREAM_EXTRA_S = 300.0


# --------------------------------------------------------------------------------------------
# The upstream: deterministic bodies, served by a subprocess, checked by the test


def stream_pieces(n: int) -> list[bytes]:
    """The SSE events of an ``n``-token llama-server chat stream, one write each."""
    pieces = [chat_event({"role": "assistant", "content": None})]
    pieces += [chat_event({"content": f" tok{i}"}) for i in range(n)]
    pieces.append(
        chat_event(
            {},
            finish_reason="stop",
            timings=make_timings(prompt_n=12, prompt_ms=3.0, predicted_n=n, predicted_ms=0.5 * n),
        )
    )
    pieces.append(DONE)
    return pieces


def stream_body(n: int) -> bytes:
    """What a client must receive for an ``n``-token stream."""
    return b"".join(stream_pieces(n))


NONSTREAM_BODY = orjson.dumps(
    {
        "choices": [
            {
                "finish_reason": "stop",
                "index": 0,
                "message": {"role": "assistant", "content": "a short answer"},
            }
        ],
        "created": 1764471600,
        "model": "gemma-3-270m-q4_k_m.gguf",
        "object": "chat.completion",
        "usage": {"completion_tokens": 3, "prompt_tokens": 12, "total_tokens": 15},
        "id": "chatcmpl-load",
        "timings": make_timings(prompt_n=12, predicted_n=3),
    }
)


def request_body(stream: bool, events: int, gap_ms: int) -> bytes:
    """A chat request; ``max_tokens`` and ``gap_ms`` tell the fake upstream what to send."""
    return orjson.dumps(
        {
            "model": "gemma",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
            "max_tokens": events,
            "gap_ms": gap_ms,
        }
    )


def _write_port(port_file: str, port: int) -> None:
    Path(port_file + ".tmp").write_text(str(port))
    os.replace(port_file + ".tmp", port_file)


def _serve_upstream(port_file: str) -> None:
    """Run the fake upstream on a free loopback port; write the port to ``port_file``."""
    from aiohttp import web

    with contextlib.suppress(ImportError):  # a faster loop if there is one: keep it fast
        import uvloop  # type: ignore[import-not-found,unused-ignore]

        uvloop.install()
    models = load_recording("models").body
    cache: dict[int, list[bytes]] = {}

    async def chat(request: web.Request) -> web.StreamResponse:
        req = orjson.loads(await request.read())
        if not req.get("stream"):
            return web.Response(body=NONSTREAM_BODY, content_type="application/json")
        n = int(req.get("max_tokens", STREAM_EVENTS))
        gap = int(req.get("gap_ms", 0)) / 1000.0
        pieces = cache.get(n) or cache.setdefault(n, stream_pieces(n))
        resp = web.StreamResponse(headers=dict(SSE_HEADERS))
        await resp.prepare(request)
        for i, piece in enumerate(pieces):
            if gap and i:
                await asyncio.sleep(gap)
            await resp.write(piece)
        await resp.write_eof()
        return resp

    async def models_route(request: web.Request) -> web.Response:
        return web.Response(body=models, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_get("/v1/models", models_route)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        _write_port(port_file, runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


# --------------------------------------------------------------------------------------------
# Processes


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds: this process only, by its id."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace)


@dataclass
class Stack:
    """The running upstream and proxy processes."""

    proxy: subprocess.Popen[bytes]
    upstream: subprocess.Popen[bytes]
    url: str
    port: int
    log_file: Path
    stderr_file: Path
    admin_url: str = ""
    """The admin listener: /stats."""

    def rss_mb(self) -> float:
        return rss_mb(self.proxy.pid)

    def log_events(self) -> Counter[str]:
        """Log lines of the proxy's log file, by ``event``."""
        counts: Counter[str] = Counter()
        with self.log_file.open("rb") as f:
            for line in f:
                if line.strip():
                    counts[orjson.loads(line).get("event", "?")] += 1
        return counts

    def records(self) -> Iterator[dict[str, Any]]:
        with self.log_file.open("rb") as f:
            for line in f:
                doc = orjson.loads(line)
                if doc.get("event") == "request_completed":
                    yield doc


def _wait_for(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    poll: float = 0.05,
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(poll)


def _answers(url: str) -> bool:
    try:
        status, _ = get_stats(url, timeout=1.0)
    except OSError:
        return False
    return status == 200


def _start_proxy(
    procs: list[subprocess.Popen[bytes]],
    config: Path,
    upstream_url: str,
    log_file: Path,
    stderr_file: Path,
    env: dict[str, str],
) -> tuple[subprocess.Popen[bytes], int, int]:
    """``python -m proxy serve`` on free ports (the agent's and the admin listener's), as in
    production; retried if a port is taken."""
    for attempt in range(3):  # the free port may be taken between the probe and the bind
        port, admin_port = free_port(), free_port()
        with stderr_file.open("wb") as err:
            proxy = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "proxy",
                    "serve",
                    "--config",
                    str(config),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--admin-listen",
                    f"127.0.0.1:{admin_port}",
                    "--upstream",
                    upstream_url,
                    "--log-file",
                    str(log_file),
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        procs.append(proxy)
        try:
            _wait_for(
                functools.partial(_answers, f"http://127.0.0.1:{admin_port}"),
                30.0,
                "proxy start",
                proxy,
            )
        except RuntimeError:
            if attempt == 2:
                raise
            continue
        return proxy, port, admin_port
    raise AssertionError("unreachable")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    """Start the fake upstream and the proxy as separate processes; stop both at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        port_file = tmp_path / "upstream.port"
        with (tmp_path / "upstream.stderr").open("wb") as err:  # the child keeps its copy
            upstream = subprocess.Popen(
                [sys.executable, "-m", "tests.test_load", "upstream", str(port_file)],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        procs.append(upstream)
        _wait_for(port_file.exists, 30.0, "fake upstream start", upstream)
        upstream_url = f"http://127.0.0.1:{port_file.read_text()}"
        config = tmp_path / "proxy.toml"
        config.write_text(
            "[server]\nshutdown_drain_s = 2.0\n"
            "[upstream]\nmax_connections = 256\n"  # 200 streams in flight at once
        )
        log_file = tmp_path / "proxy.jsonl"
        stderr_file = tmp_path / "proxy.stderr"
        proxy, port, admin_port = _start_proxy(
            procs, config, upstream_url, log_file, stderr_file, env
        )
        yield Stack(
            proxy=proxy,
            upstream=upstream,
            url=f"http://127.0.0.1:{port}",
            admin_url=f"http://127.0.0.1:{admin_port}",
            port=port,
            log_file=log_file,
            stderr_file=stderr_file,
        )
    finally:
        for proc in reversed(procs):
            _stop(proc)


# --------------------------------------------------------------------------------------------
# Measuring


def get_stats(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One blocking ``GET /stats``: status and body."""
    return get(url, "/stats", timeout)


def get(url: str, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """One blocking GET on a fresh connection: status and body."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _stats_failure(status: int, body: bytes) -> str | None:
    """Why a ``/stats`` answer is wrong, or None: a 200 with a document counting requests."""
    if status != 200:
        return f"status {status}"
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"not JSON: {body[:80]!r}"
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), int):
        return f"no request count: {body[:80]!r}"
    return None


def _poll_stats(url: str, interval: float) -> None:
    """Subprocess body: poll ``/stats`` and a trivial reserved path until stdin closes.

    Prints one JSON object: the latencies of each path in seconds, and the failures (an
    error, no answer within ``STATS_ANSWER_S``, or a wrong answer). The trivial path
    (``/stats/records/none``, a 404 from the same admin listener, on its own thread) shows
    how much of the ``/stats`` latency is waiting for that thread's turn rather than the
    ``/stats`` work.
    """
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    out: dict[str, Any] = {"stats": [], "trivial": [], "failures": []}
    deadline = time.monotonic() + 3600
    while not stop.wait(interval) and time.monotonic() < deadline:
        for key, path, want in (("stats", "/stats", 200), ("trivial", "/stats/records/none", 404)):
            t = time.perf_counter()
            try:
                status, body = get(url, path, timeout=STATS_ANSWER_S)
            except OSError as exc:
                out["failures"].append(f"{path}: {type(exc).__name__}")
                continue
            out[key].append(time.perf_counter() - t)
            if key == "stats":
                failure = _stats_failure(status, body)
            else:
                failure = None if status == want else f"status {status}"
            if failure is not None:
                out["failures"].append(f"{path}: {failure}")
    sys.stdout.write(orjson.dumps(out).decode() + "\n")


class StatsPoller:
    """Polls ``/stats`` from its own process, so the load's client adds no delay to it."""

    def __init__(self, url: str, interval: float = 0.5) -> None:
        self.url = url
        self.interval = interval
        self.latencies: list[float] = []
        self.trivial: list[float] = []
        self.failures: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> StatsPoller:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.test_load", "poll", self.url, str(self.interval)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self._proc
        assert proc is not None
        out = b""
        try:
            out, _ = proc.communicate(b"", timeout=30)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _stop(proc)
        try:
            doc = orjson.loads(out)
        except orjson.JSONDecodeError:
            self.failures = [f"the poller printed no result (exit {proc.returncode})"]
            return
        self.latencies, self.trivial, self.failures = doc["stats"], doc["trivial"], doc["failures"]

    @staticmethod
    def _quantile(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    def summary(self) -> str:
        def ms(values: list[float]) -> str:
            return "p50 {:.1f} ms, p99 {:.1f} ms, max {:.1f} ms".format(
                *(1000 * self._quantile(values, q) for q in (0.5, 0.99, 1.0))
            )

        return (
            f"/stats {ms(self.latencies)} over {len(self.latencies)} polls; the same listener's "
            f"trivial 404 {ms(self.trivial)}; failures {self.failures or 0}"
        )


@dataclass
class Tally:
    """Client-side results of a run."""

    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    first_errors: list[str] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors[what.split(":")[0]] += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(what)


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, expected: bytes, tally: Tally
) -> None:
    tally.sent += 1
    try:
        async with session.post(
            url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            got = await resp.read()
            if resp.status != 200:
                tally.error(f"status: {resp.status} {got[:200]!r}")
            elif got != expected:
                tally.error(f"bytes: got {len(got)} bytes, expected {len(expected)}")
            else:
                tally.ok += 1
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.error(f"{type(exc).__name__}: {exc}")


async def _drive(
    url: str,
    concurrency: int,
    make: Callable[[int], tuple[bytes, bytes]],
    *,
    until: Callable[[], bool] | None = None,
    total: int | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Tally:
    """``concurrency`` workers send requests until ``until()`` is true or the total count."""
    tally = Tally()
    counter = iter(range(total if total is not None else 1 << 62))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            for i in counter:
                if until is not None and until():
                    return
                body, expected = make(i)
                await _one(session, url, body, expected, tally)
                if on_progress is not None:
                    on_progress(tally.sent)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tally


def _wait_recorded(stack: Stack, count: int, timeout: float = 60.0) -> Counter[str]:
    events: Counter[str] = Counter()

    def done() -> bool:
        nonlocal events
        events = stack.log_events()
        return events["request_completed"] >= count

    with contextlib.suppress(TimeoutError):
        _wait_for(done, timeout, "records", poll=0.5)
    return events


def _check_records(stack: Stack, sent: int, log: Callable[[str], None]) -> None:
    """Every request sent is in the log and in /stats, each completed with status 200."""
    events = _wait_recorded(stack, sent)
    outcomes = Counter((r["outcome"], r["status"], r["analysis_error"]) for r in stack.records())
    status, body = get_stats(stack.admin_url)
    assert status == 200
    stats = orjson.loads(body)
    others = {k: v for k, v in events.items() if k not in EXPECTED_EVENTS}
    log(
        f"recorded: {events['request_completed']} request_completed lines for {sent} requests, "
        f"/stats requests={stats['requests']}, outcomes {dict(outcomes)}, other log events "
        f"{others or 'none'}"
    )
    assert events["request_completed"] == sent, "not every request was recorded"
    assert stats["requests"] == sent, "/stats does not count every request"
    assert outcomes == Counter({("completed", 200, None): sent}), outcomes
    assert not others, f"unexpected log events: {others}"
    stderr = stack.stderr_file.read_text(errors="replace")
    assert "Traceback" not in stderr, stderr[-3000:]


def _idle_stats_latency(url: str, sent: int, polls: int = 20) -> list[float]:
    """``/stats`` latencies once the load has stopped (its windows full); each poll answers
    (within ``STATS_ANSWER_S``) a document counting the ``sent`` requests."""
    out = []
    for _ in range(polls):
        t = time.perf_counter()
        status, body = get_stats(url, timeout=STATS_ANSWER_S)
        out.append(time.perf_counter() - t)
        assert _stats_failure(status, body) is None, _stats_failure(status, body)
        assert orjson.loads(body)["requests"] == sent
    return sorted(out)


def _settled(samples: list[tuple[float, int, float]]) -> list[float]:
    """The RSS samples (MB) taken once the /stats windows were full."""
    return [mb for _, n, mb in samples if n >= SETTLED_AFTER]


def _assert_settled(samples: list[tuple[float, int, float]]) -> None:
    """Once the /stats windows are full (10,000 records per kind), RSS must stop growing;
    a run with too few samples after that point cannot show it and fails."""
    settled = _settled(samples)
    assert len(settled) >= SETTLED_SAMPLES, (
        f"only {len(settled)} RSS samples after {SETTLED_AFTER} requests (need "
        f"{SETTLED_SAMPLES}): the run was too short to show RSS settling; samples "
        f"(s, requests, MB): {samples}"
    )
    assert settled[-1] <= settled[0] + 10.0, f"RSS still growing after the windows: {settled}"


def _report_rss(log: Callable[[str], None], samples: list[tuple[float, int, float]]) -> None:
    line = ", ".join(f"{t:.0f}s/{n}req:{mb:.1f}" for t, n, mb in samples)
    log(f"proxy RSS MB over time (s/requests:MB): {line}")


# --------------------------------------------------------------------------------------------
# The tests


async def test_concurrent_streams(stack: Stack, request: pytest.FixtureRequest) -> None:
    """200 concurrent streams for a while: exact bytes, all recorded, /stats answering, and
    RSS flat, also once the /stats windows are full."""
    log = terminal_log(request.config, "load")
    body = request_body(True, STREAM_EVENTS, STREAM_GAP_MS)
    expected = stream_body(STREAM_EVENTS)

    def make(_: int) -> tuple[bytes, bytes]:
        return body, expected

    # warm-up: connections, pools, allocator arenas, the first stats windows
    warm = await _drive(stack.url, STREAMS, make, total=2 * STREAMS)
    assert not warm.errors, warm.first_errors
    _wait_recorded(stack, warm.sent)
    rss_start = stack.rss_mb()
    samples: list[tuple[float, int, float]] = [(0.0, warm.sent, rss_start)]
    t0 = time.monotonic()
    sent_so_far = [warm.sent]

    async def sample_rss() -> None:
        while True:
            await asyncio.sleep(RSS_SAMPLE_S)
            samples.append((time.monotonic() - t0, sent_so_far[0], stack.rss_mb()))

    def progress(n: int) -> None:
        sent_so_far[0] = warm.sent + n

    def finished() -> bool:
        """STREAM_SECONDS done and RSS sampled enough once the windows were full (or the
        extra time is up: then ``_assert_settled`` says the run was too short)."""
        elapsed = time.monotonic() - t0
        if elapsed >= STREAM_SECONDS + STREAM_EXTRA_S:
            return True
        return elapsed >= STREAM_SECONDS and len(_settled(samples)) >= SETTLED_SAMPLES

    with StatsPoller(stack.admin_url) as poller:
        sampler = asyncio.ensure_future(sample_rss())  # noqa: TID251 (held, cancelled below)
        try:
            async with asyncio.timeout(STREAM_SECONDS + STREAM_EXTRA_S + 120):
                tally = await _drive(stack.url, STREAMS, make, until=finished, on_progress=progress)
        finally:
            sampler.cancel()
    elapsed = time.monotonic() - t0
    sent = warm.sent + tally.sent
    _wait_recorded(stack, sent)
    rss_end = stack.rss_mb()
    samples.append((elapsed, sent, rss_end))
    log(
        f"streams: {STREAMS} concurrent x {STREAM_EVENTS + 3} events ({STREAM_GAP_MS} ms "
        f"apart), {tally.sent} streams in {elapsed:.1f} s = {tally.sent / elapsed:.0f} "
        f"streams/s, {tally.ok} byte-identical, errors {dict(tally.errors) or 0}"
    )
    log(f"streams: {poller.summary()}")
    log(
        f"streams: proxy RSS start {rss_start:.1f} MB (after {warm.sent} warm-up streams), "
        f"end {rss_end:.1f} MB, delta {rss_end - rss_start:+.1f} MB"
    )
    _report_rss(log, samples)
    assert not tally.errors, tally.first_errors
    assert tally.ok == tally.sent > STREAMS
    _check_records(stack, sent, log)
    idle = _idle_stats_latency(stack.admin_url, sent)
    log(
        f"streams: /stats after the load p50 {1000 * idle[len(idle) // 2]:.1f} ms, max "
        f"{1000 * idle[-1]:.1f} ms"
    )
    assert not poller.failures, poller.failures
    assert len(poller.latencies) >= 10, "/stats was hardly polled during the load"
    assert rss_end <= rss_start + RSS_SLACK_MB, "the proxy's memory grew under load"
    _assert_settled(samples)


async def test_soak(stack: Stack, request: pytest.FixtureRequest) -> None:
    """A soak of short stream and non-stream requests: no errors, all recorded, /stats
    answering, and RSS flat, also once the /stats windows are full."""
    log = terminal_log(request.config, "load")
    cases = [
        (request_body(False, 0, 0), NONSTREAM_BODY),
        (request_body(True, SOAK_EVENTS, 0), stream_body(SOAK_EVENTS)),
    ]

    def make(i: int) -> tuple[bytes, bytes]:
        return cases[i % 2]

    warm = await _drive(stack.url, SOAK_CONCURRENCY, make, total=500)
    assert not warm.errors, warm.first_errors
    _wait_recorded(stack, warm.sent)
    rss_start = stack.rss_mb()
    samples: list[tuple[float, int, float]] = [(0.0, warm.sent, rss_start)]
    t0 = time.monotonic()
    step = SOAK_REQUESTS // 10

    next_sample = [step]

    def progress(n: int) -> None:
        if n >= next_sample[0]:
            next_sample[0] += step
            samples.append((time.monotonic() - t0, warm.sent + n, stack.rss_mb()))

    with StatsPoller(stack.admin_url, interval=1.0) as poller:
        async with asyncio.timeout(1800 if FULL else 300):
            tally = await _drive(
                stack.url, SOAK_CONCURRENCY, make, total=SOAK_REQUESTS, on_progress=progress
            )
    elapsed = time.monotonic() - t0
    sent = warm.sent + tally.sent
    _wait_recorded(stack, sent)
    rss_end = stack.rss_mb()
    samples.append((elapsed, sent, rss_end))
    log(
        f"soak: {tally.sent} requests (half streams of {SOAK_EVENTS + 3} events, half JSON) "
        f"at concurrency {SOAK_CONCURRENCY} in {elapsed:.1f} s = {tally.sent / elapsed:.0f} "
        f"req/s, {tally.ok} byte-identical, errors {dict(tally.errors) or 0}"
    )
    log(f"soak: {poller.summary()}")
    log(
        f"soak: proxy RSS start {rss_start:.1f} MB, end {rss_end:.1f} MB, delta "
        f"{rss_end - rss_start:+.1f} MB"
    )
    _report_rss(log, samples)
    assert not tally.errors, tally.first_errors
    assert tally.ok == tally.sent == SOAK_REQUESTS
    _check_records(stack, sent, log)
    idle = _idle_stats_latency(stack.admin_url, sent)
    log(
        f"soak: /stats after the load p50 {1000 * idle[len(idle) // 2]:.1f} ms, max "
        f"{1000 * idle[-1]:.1f} ms"
    )
    assert not poller.failures, poller.failures
    assert poller.latencies, "/stats was never polled during the soak"
    assert rss_end <= rss_start + RSS_SLACK_MB, "the proxy's memory grew during the soak"
    _assert_settled(samples)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "upstream":
        _serve_upstream(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "poll":
        _poll_stats(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit("usage: python -m tests.test_load upstream PORT_FILE | poll URL INTERVAL")
