"""The relay bench's machinery (``bench/relay_overhead.py``), shared by the peers and load
benches: processes (``procs``, ``servers``), one interleaved run (``run``, ``measure``), the
analysis cost in-process (``tracker_cost``), the machine (``machine``), the report (``report``)."""
