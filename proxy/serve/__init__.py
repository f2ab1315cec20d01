"""The I/O that serves the core: the aiohttp app, the relay, the clients of llama-server,
the record sinks (log, /stats, /metrics) and the dashboard."""
