"""The admin listener on its own thread (:mod:`proxy.serve.admin`): its pages answer while
the relay's event loop is busy, its start and stop, and reads of the relay's state that see
each record whole."""

from __future__ import annotations

import errno
import socket
import sys
import threading
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import structlog
from aiohttp import web

from proxy.commands.ports import free_port
from proxy.config import load_config
from proxy.core.record import Kind, Outcome, Record
from proxy.core.request import RequestFacts
from proxy.serve.admin import AdminThread
from proxy.serve.app import build_admin_app, build_app
from proxy.serve.keys import METRICS, MODEL_INFO, STATE_LOCK, STATS
from proxy.serve.sinks import RecordSinks


def _app() -> web.Application:
    """The relaying application (not started: no upstream session) of a default config."""
    return build_app(load_config(None, {"upstream": {"url": "http://127.0.0.1:9"}}))


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read()


@pytest.fixture
async def served() -> AsyncIterator[tuple[web.Application, str]]:
    """A relaying application and the URL of its admin listener, served by an AdminThread."""
    app = _app()
    port = free_port()
    admin = AdminThread(build_admin_app(app), "127.0.0.1", port)
    await admin.start()
    try:
        yield app, f"http://127.0.0.1:{port}"
    finally:
        await admin.stop()


def _record(i: int, outcome: Outcome) -> Record:
    return Record(
        id=f"r-{i}", ts="t", method="POST", path="/v1/chat/completions", kind=Kind.CHAT,
        ttft_ms=float(i % 50), e2e_ms=float(i % 70), outcome=outcome, status=200,
    )  # fmt: skip


async def test_pages_answer_while_the_relay_loop_is_blocked(
    served: tuple[web.Application, str],
) -> None:
    """A blocking read issued from the relay loop's own thread gets its answer: the admin
    pages do not wait for that loop (on the same loop this read could never be served)."""
    _, url = served
    status, body = _get(url + "/stats")  # blocks this loop until the answer is in
    assert status == 200 and orjson.loads(body)["requests"] == 0
    status, page = _get(url + "/dashboard")
    assert status == 200 and b"<html" in page.lower()


async def test_stop_closes_the_socket_and_ends_the_thread() -> None:
    """After stop() the admin port refuses connections and no admin thread is left."""
    port = free_port()
    admin = AdminThread(build_admin_app(_app()), "127.0.0.1", port)
    await admin.start()
    assert any(t.name == "timing-proxy-admin" for t in threading.enumerate())
    await admin.stop()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    assert not any(t.name == "timing-proxy-admin" for t in threading.enumerate())


async def test_a_port_in_use_fails_the_start_with_the_bind_error() -> None:
    """start() raises the bind's OSError (address in use), and the thread is gone."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        admin = AdminThread(build_admin_app(_app()), "127.0.0.1", port)
        with pytest.raises(OSError) as raised:
            await admin.start()
    assert raised.value.errno == errno.EADDRINUSE
    assert not any(t.name == "timing-proxy-admin" for t in threading.enumerate())


async def test_a_stats_read_waits_for_a_record_being_counted(
    served: tuple[web.Application, str],
) -> None:
    """While the relay holds the state lock (a record's sinks are running), a /stats read
    waits, and then counts that record."""
    app, url = served
    got: list[bytes] = []
    with app[STATE_LOCK]:
        reader = threading.Thread(target=lambda: got.append(_get(url + "/stats")[1]))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not got  # waiting for the lock
        app[STATS].add(_record(0, Outcome.COMPLETED))
    reader.join(10)
    assert orjson.loads(got[0])["requests"] == 1


async def test_reads_during_records_see_every_record_whole(
    served: tuple[web.Application, str],
) -> None:
    """Records go through the relay's sinks on this thread while another thread reads
    /stats as fast as it can: every document holds whole records (its request count equals
    its outcome and API counts), and counts never go back. The threads switch at
    almost every bytecode, so a read without the lock would meet a record half counted."""
    app, url = served
    lock = app[STATE_LOCK]
    relay_sinks = RecordSinks(
        app[STATS], app[METRICS], app[MODEL_INFO], structlog.get_logger(), lock
    )
    relay_sinks.sinks.remove(relay_sinks.log_record)  # 3,000 log lines would only slow it
    stop = threading.Event()
    docs: list[dict[str, Any]] = []

    failures: list[BaseException] = []

    def read() -> None:
        while not stop.is_set():
            try:
                docs.append(orjson.loads(_get(url + "/stats")[1]))
            except Exception as exc:  # a 500: a read that met a record half counted
                failures.append(exc)

    reader = threading.Thread(target=read)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch at almost any bytecode: mid-record too
    reader.start()
    facts = RequestFacts(kind=Kind.CHAT, stream=True)
    try:
        for i in range(3000):
            outcome = Outcome.COMPLETED if i % 3 else Outcome.UPSTREAM_ERROR
            relay_sinks(_record(i, outcome), facts, None)
    finally:
        stop.set()
        reader.join(10)
        sys.setswitchinterval(switch)
    assert not failures, failures[:3]
    assert len(docs) > 10, "the reader hardly ran"
    assert len({doc["requests"] for doc in docs}) > 5, "few reads met records coming in"
    counts = [doc["requests"] for doc in docs]
    assert counts == sorted(counts)
    for doc in docs:
        outcomes = doc["outcomes"]
        apis = doc["apis"]
        assert isinstance(outcomes, dict) and isinstance(apis, dict)
        assert sum(outcomes.values()) == doc["requests"] == sum(apis.values())
    assert orjson.loads(_get(url + "/stats")[1])["requests"] == 3000
