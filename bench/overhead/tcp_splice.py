"""Reference path ``tcp-splice``: bytes copied between each client connection and an
upstream connection of its own, no HTTP at all. The floor cost of any user-space hop on
this machine (two more socket hops and the wake-ups between them)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from bench.overhead.constants import HOST
from bench.overhead.serving import announce, until_stopped
from proxy.serve.tasks import spawn


class UpstreamSide(asyncio.Protocol):
    """The upstream leg: every byte goes to the client; the client is closed with it."""

    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class ClientSide(asyncio.Protocol):
    """The client leg: connects upstream when the client connects, and holds the client's
    bytes until that connection is up."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.tasks: set[asyncio.Future[Any]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.pending: list[bytes] = []
        self.up: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        task = spawn(
            loop.create_connection(lambda: UpstreamSide(transport), self.host, self.port),
            self.tasks,
        )
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[Any]) -> None:
        if task.exception() is not None:
            self.transport.close()
            return
        up, _proto = task.result()
        up.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.up = up
        for data in self.pending:
            up.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.up is None:
            self.pending.append(data)
        else:
            self.up.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.up is not None:
            self.up.close()


def run_tcp_splice(upstream: str, port: int) -> None:
    """Copies bytes between each accepted connection and one upstream connection of its
    own, with asyncio protocols: no HTTP parsing, no headers rewritten, nothing analysed.
    No HTTP proxy can add less than this: it is the cost of one more process in the path
    (two more socket hops and the wake-ups between them). The upstream connection is opened
    when the client connects, so for a stream (after which the upstream closes and the
    splice closes the client's connection) the client's connect overlaps the upstream's."""
    host, _, up_port = upstream.removeprefix("http://").partition(":")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: ClientSide(host, int(up_port)), HOST, port)
        announce(server.sockets[0].getsockname()[1])
        await until_stopped()
        server.close()

    asyncio.run(main())
