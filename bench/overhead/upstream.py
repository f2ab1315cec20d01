"""The fake llama-server process: ``tests.fakes.FakeUpstream`` answering with the fast
``llama_chat`` script (the same fake the relay tests use), on 127.0.0.1:<free port>."""

from __future__ import annotations

import asyncio

from bench.overhead.serving import serve_app
from tests.fakes import FakeUpstream, llama_chat


def run_upstream(keep_streams_alive: bool = False) -> None:
    """Serve the fake llama-server; print the port; stop on SIGTERM.

    Like llama-server, it closes the connection after every event stream (llama-server does
    so silently; here ``Connection: close`` says so, so that the direct client never races a
    stale socket). Direct and proxied streams thus both pay one TCP connect to the upstream.
    ``seen`` is not kept: the run sends tens of thousands of requests.
    """
    fake = FakeUpstream(llama_chat(keep_streams_alive), keep_seen=False)
    asyncio.run(serve_app(fake.app, 0))
