#!/usr/bin/env python3
"""timing-proxy under concurrent load, as its own process (``python -m proxy serve`` with its
log file), in front of the fast fake llama-server: ``streams`` (``--streams`` concurrent
clients sending back-to-back paced streams for ``--seconds``) and ``soak`` (``--soak`` short
streams and JSON replies at concurrency 50), each through a fresh proxy, with ``/stats``
polled from a process of its own and the proxy's RSS sampled. The figures are printed and
written to ``bench/results/load-<UTC time>.json``; nothing is asserted.

    .venv/bin/python bench/load.py [--quick] [--seconds S] [--soak N] [--out FILE] [--tree DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ``bench``, ``tests``, ``proxy``

from bench.overhead.machine import command_line, machine_info, save_run
from bench.overhead.measure import HEADERS, chat_body, pct
from bench.overhead.procs import PY, ROOT, Proc, start_proxy, start_role, wait_ready
from bench.overhead.report import run_lines
from proxy.core.timestamps import iso_utc
from tests.fakes import CHAT_PATH

Case = tuple[bytes, bytes]  # a request body, the bytes the client must get


def call(url: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    """One blocking GET (or POST of ``body``) on a fresh connection: status and body."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10.0)
    try:
        conn.request("GET" if body is None else "POST", path, body, HEADERS if body else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def poll(url: str, interval: float) -> None:
    """The ``--poll`` process: ``/stats`` and a trivial 404 until stdin closes; prints their
    latencies (s) and the failures (no answer, or not a document counting requests)."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    out: dict[str, list[Any]] = {"stats": [], "trivial": [], "failures": []}
    print("ready", flush=True)
    while not stop.wait(interval):
        for key, path in (("stats", "/stats"), ("trivial", "/stats/records/none")):
            t = time.perf_counter()
            try:
                status, body = call(url, path)
            except OSError as exc:
                out["failures"].append(f"{path}: {type(exc).__name__}")
                continue
            out[key].append(time.perf_counter() - t)
            ok = status == 404 if key == "trivial" else status == 200 and b'"requests"' in body
            if not ok:
                out["failures"].append(f"{path}: status {status}")
    print(json.dumps(out), flush=True)


async def drive(
    url: str, concurrency: int, cases: list[Case], until: Callable[[int], bool]
) -> dict[str, Any]:
    """``concurrency`` clients send ``cases`` in turn until ``until(sent)``; a tally."""
    import aiohttp

    tally: dict[str, Any] = {"sent": 0, "identical": 0, "errors": Counter()}
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client() -> None:
            while not until(tally["sent"]):
                body, expected = cases[tally["sent"] % len(cases)]
                tally["sent"] += 1
                try:
                    async with session.post(url + CHAT_PATH, data=body, headers=HEADERS) as r:
                        got = await r.read()
                    tally["identical"] += got == expected
                    if r.status != 200:
                        tally["errors"][f"HTTP {r.status}"] += 1
                except (aiohttp.ClientError, TimeoutError) as exc:
                    tally["errors"][type(exc).__name__] += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
    tally["errors"] = dict(tally["errors"])
    return tally


def recorded(proxy: Proc, log_file: Path, sent: int) -> dict[str, Any]:
    """The log's ``request_completed`` lines by outcome and ``/stats``' count, once the
    proxy has handed off every record (or after 60 s)."""
    lines: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log_file.read_text()  # whole lines only: the proxy may be writing one
        lines = Counter(
            f"{d['outcome']} {d['status']}"
            for d in map(json.loads, text[: text.rfind("\n") + 1].splitlines())
            if d.get("event") == "request_completed"
        )
        if sum(lines.values()) >= sent:
            break
        time.sleep(0.5)
    stats = json.loads(call(proxy.admin_url, "/stats")[1])
    return {"sent": sent, "log_lines": dict(lines), "stats_requests": stats["requests"]}


def _poller(admin_url: str) -> subprocess.Popen[bytes]:
    cmd = [PY, __file__, "--poll", admin_url]  # prints "ready", then its figures at stdin's end
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


async def scenario(
    upstream: Proc,
    tmp: Path,
    name: str,
    concurrency: int,
    cases: list[Case],
    until: Callable[[int, float], bool],
    tree: Path = ROOT,
) -> dict[str, Any]:
    """One scenario through a fresh proxy: warm-up, the load with the poller and the RSS
    samples, then the records."""
    import aiohttp

    log_file = tmp / f"{name}.jsonl"
    proxy = start_proxy(name, upstream.url, tmp, log_file, tree=tree)
    try:
        async with aiohttp.ClientSession() as probe:  # /stats answers once the proxy listens
            await wait_ready(probe, proxy, proxy.admin_url + "/stats")
        warm = await drive(proxy.url, concurrency, cases, lambda n: n >= 2 * concurrency)
        rss: list[tuple[float, float]] = [(0.0, proxy.rss_mib())]
        poller = _poller(proxy.admin_url)
        assert poller.stdout is not None
        await asyncio.to_thread(poller.stdout.readline)  # "ready": its imports are done
        t0 = time.monotonic()

        async def sample() -> None:
            while True:
                await asyncio.sleep(5.0)
                rss.append((time.monotonic() - t0, proxy.rss_mib()))

        sampler = asyncio.ensure_future(sample())  # noqa: TID251 - held, cancelled below
        try:
            tally = await drive(proxy.url, concurrency, cases, lambda n: until(n, t0))
        finally:
            sampler.cancel()
        seconds = time.monotonic() - t0
        rss.append((seconds, proxy.rss_mib()))
        polled = json.loads((await asyncio.to_thread(poller.communicate, b"", 60))[0] or b"{}")
        tally |= {"seconds": seconds, "per_second": tally["sent"] / seconds, "rss_mib": rss}
        tally |= {
            "polled": polled,
            "records": recorded(proxy, log_file, warm["sent"] + tally["sent"]),
        }
        return {"warmup": warm, **tally}
    finally:
        proxy.stop()


def _ms(values: list[float], q: float) -> str:
    return f"{pct(values, q) * 1e3:.1f}" if values else "–"


def report(res: dict[str, Any]) -> str:
    """The header and one row per scenario."""
    load = " / ".join(f"{x:.2f}" for x in res["machine"]["load_average"])
    lines = [
        *run_lines(res),
        f"Load average (1/5/15 min) before: {load}",
        "",
        "| Scenario | requests | per second | bytes = direct | errors | recorded: log lines / "
        "`/stats` | `/stats` p50 / p99 (ms) | trivial 404 p50 (ms) | RSS start / max / end (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in res["scenarios"].items():
        rec, p, rss = s["records"], s["polled"], [mb for _, mb in s["rss_mib"]]
        lines.append(
            f"| {res['describe'][name]} | {s['sent']:,} | {s['per_second']:,.0f} | "
            f"{s['identical']:,} | {s['errors'] or 0} | {sum(rec['log_lines'].values()):,} / "
            f"{rec['stats_requests']:,} of {rec['sent']:,} | {_ms(p.get('stats', []), 50)} / "
            f"{_ms(p.get('stats', []), 99)} | {_ms(p.get('trivial', []), 50)} | "
            f"{rss[0]:.1f} / {max(rss):.1f} / {rss[-1]:.1f} |"
        )
        if p.get("failures"):
            lines.append(f"\n{name}: `/stats` poll failures: {p['failures'][:5]}")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: 5 s of streams, 2,000 soak")
    p.add_argument("--streams", type=int, default=200, help="concurrent streams (200)")
    p.add_argument("--seconds", type=float, help="seconds of streams (50; quick 5)")
    p.add_argument("--gap-ms", type=float, default=5.0, help="between two events of a stream (5)")
    p.add_argument("--soak", type=int, help="soak requests (20000; quick 2000)")
    p.add_argument("--out", type=Path, help="JSON file (default bench/results/load-<UTC>.json)")
    p.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose proxy runs (this)")
    p.add_argument("--poll", help=argparse.SUPPRESS)  # the poller process: the admin URL
    args = p.parse_args()
    args.seconds = args.seconds or (5.0 if args.quick else 50.0)
    args.soak = args.soak or (2000 if args.quick else 20_000)
    return args


async def run(args: argparse.Namespace, stamp: datetime) -> dict[str, Any]:
    """Both scenarios in front of one fake upstream; direct's bytes are the reference."""
    started, tmp = time.perf_counter(), Path(tempfile.mkdtemp(prefix="bench-load-"))
    res: dict[str, Any] = {"timestamp": iso_utc(stamp, timespec="seconds")}
    res |= {"command": command_line("bench/load.py"), "machine": machine_info(), "args": vars(args)}
    up = start_role("upstream")
    try:
        direct: list[Case] = []
        for body in (chat_body(16, True, args.gap_ms), chat_body(4, True), chat_body(3, False)):
            direct.append((body, call(up.url, CHAT_PATH, body)[1]))
        res["describe"] = {
            "streams": f"{args.streams} concurrent streams of 19 events, {args.gap_ms:g} ms apart",
            "soak": "50 concurrent: 4-token streams and JSON replies, in turn",
        }
        plan: dict[str, tuple[int, list[Case], Callable[[int, float], bool]]] = {
            "streams": (
                args.streams,
                direct[:1],
                lambda n, t0: time.monotonic() - t0 >= args.seconds,
            ),
            "soak": (50, direct[1:], lambda n, t0: n >= args.soak),
        }
        res["scenarios"] = {n: await scenario(up, tmp, n, *p, args.tree) for n, p in plan.items()}
    finally:
        up.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    res["runtime_s"] = time.perf_counter() - started
    return res


def main() -> int:
    args = parse_args()
    if args.poll:
        poll(args.poll, 0.5)
        return 0
    res = asyncio.run(run(args, datetime.now(UTC)))
    save_run(res, report(res), "load", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
