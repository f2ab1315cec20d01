"""The relay-overhead benchmark (``bench/relay_overhead.py`` is its entry point).

Module map, in the order a run uses them:

* ``cli``: the command-line options (full-run and ``--quick`` sizes).
* ``constants``: the loopback host, the checkout, the targets, the step and path names.
* ``upstream``: the fake llama-server process (``tests.fakes.llama_chat``, shared with the tests).
* ``serving``: what every server process shares (announce the port, run until SIGTERM).
* ``bare_relay``, ``lean_relay``, ``tcp_splice``: the reference relays.
* ``processes``: start and stop the upstream, the proxies and the references; CPU clocks.
* ``client``: request bodies and the client's timed reads.
* ``rig``: the running paths and client sessions a step measures.
* ``latency``, ``event_delay``, ``throughput``, ``robots``, ``tracker_cost``: the steps.
* ``profile``, ``profile_stacks``: py-spy during chosen workloads, and its stacks summarised.
* ``percentiles``: the percentile summary every step uses.
* ``machine``: the machine, the code version, the command line.
* ``run``: one whole run (start the processes, run the steps, collect the results).
* ``report``, ``report_tables``: the Markdown report of a run's results.
* ``main``: the entry point (a server role, or a run written to JSON and printed).
"""
