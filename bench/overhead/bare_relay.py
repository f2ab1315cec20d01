"""Reference path ``bare-relay``: the proxy's relay loop in aiohttp with nothing else, the
floor cost of relaying with aiohttp on this machine (not a product)."""

from __future__ import annotations

import asyncio

from bench.overhead.serving import HOP, relay_app, serve_app


def run_bare_relay(upstream: str, port: int) -> None:
    """The same relay loop as the proxy (readany -> write) with nothing else: no tracker,
    no timeouts, no record, no log line. Not a product: a reference for the numbers.
    Like the proxy, it pools upstream connections for plain requests and opens a fresh one
    for each stream (llama-server closes the connection after a stream)."""
    import aiohttp
    from aiohttp import web

    async def main() -> None:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False
        )
        stream_session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True), auto_decompress=False
        )

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
            use = stream_session if b'"stream":true' in body else session
            async with use.request(
                request.method,
                upstream + request.raw_path,
                data=body or None,
                headers=headers,
                skip_auto_headers=("User-Agent", "Accept", "Content-Type"),
            ) as up:
                resp = web.StreamResponse(
                    status=up.status,
                    headers={k: v for k, v in up.headers.items() if k.lower() not in HOP},
                )
                if up.content_length is not None:
                    resp.content_length = up.content_length
                await resp.prepare(request)
                read = up.content.readany
                while chunk := await read():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp

        await serve_app(relay_app(handle), port)
        await session.close()
        await stream_session.close()

    asyncio.run(main())
