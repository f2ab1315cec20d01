#!/usr/bin/env python3
"""timing-proxy beside its peers: direct, the bare aiohttp relay, timing-proxy, LiteLLM's
proxy, the Portkey gateway, kvprof's tap and mitmproxy in reverse mode, in front of the same
fast fake llama-server, interleaved in one run.

Usage::

    .venv/bin/python bench/peers.py [--quick] [--peers timing-proxy,litellm,...]
                                    [--out bench/results/NAME.json] [--install-only]

Each peer is installed on first use into its own virtualenv or ``node_modules`` under
``$TIMING_PROXY_CACHE/peers`` (default ``~/.cache/timing-proxy/peers``); one that cannot be
installed or started is skipped and the table says why. See bench/README.md ("Peers").
The code is the package ``bench/peers/``; this file is its entry point.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ``bench``, ``tests``, ``proxy``

from bench.peers.main import main

if __name__ == "__main__":
    sys.exit(main())
