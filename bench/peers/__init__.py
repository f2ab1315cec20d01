"""The peers benchmark (``bench/peers.py`` is its entry point): timing-proxy beside the
proxies a user would pick instead, in front of the same fast fake llama-server, in one
interleaved run. It reuses ``bench/overhead`` (the fake upstream, the proxy and bare-relay
launchers, the client's timed reads, percentiles, the machine's description).

Module map, in the order a run uses them:

* ``cli``: the options (full-run and ``--quick`` sizes, ``--peers``).
* ``install``: each peer's own virtualenv or ``node_modules`` in the cache, made on first use.
* ``launch``: start each path (timing-proxy, bare relay, LiteLLM, Portkey, kvprof, mitmproxy).
* ``proctree``: CPU time and RSS of a path's whole process tree.
* ``rig``: the live paths, their client sessions, the random order.
* ``measure``: latency per request (stream and JSON reply) and the long stream.
* ``run``: one whole run (start, measure, the load around it, the results dict).
* ``report``: the Markdown table and where timing-proxy stands (pure).
* ``main``: install only, or a run written to JSON and printed.
"""
