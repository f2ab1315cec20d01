#!/usr/bin/env python3
"""Relay overhead of timing-proxy: direct vs proxied requests, interleaved, in one run.

Three processes on 127.0.0.1 only:

* a fast fake llama-server (this file, ``--role upstream``: ``tests.fakes.FakeUpstream`` with the
  ``llama_chat`` script, which writes each llama-shaped SSE event as its own chunk, as fast as
  possible or paced);
* the proxy (``python -m proxy serve --listen ... --upstream ...``), stdout to /dev/null with
  the JSON log line per request left on (the production cost); optionally a second proxy
  running on uvloop (``--uvloop``);
* the load client (this process, one aiohttp session).

and, as references for what any relay costs on the machine, a bare aiohttp relay, a lean
relay (aiohttp server, httptools upstream client; when httptools is installed) and a TCP
splice (bytes copied between sockets, no HTTP).

It measures, in this order: the added latency per request (streamed and plain; direct and
proxied requests interleaved in random order per round), the per-event forwarding delay of a
paced stream (each event carries the upstream's CLOCK_MONOTONIC stamp), the throughput of one
long stream, the proxy's CPU time per event (process CPU clock of the proxy during the long
stream and during a load of concurrent 30 tok/s "robot" streams), and in-process the CPU cost
of ``StreamTracker.feed`` per event. It prints Markdown tables and writes a JSON file.

Usage::

    .venv/bin/python bench/relay_overhead.py [--quick] [--uvloop] [--profile]
                                             [--out bench/results/NAME.json]

See bench/README.md for the method and what each number means. The code is the package
``bench/overhead/`` (module map in its ``__init__``); this file is its entry point.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ``bench``, ``tests``, ``proxy``

from bench.overhead.main import main

if __name__ == "__main__":
    sys.exit(main())
