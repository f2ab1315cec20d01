"""The pure core: bytes, events and an injected clock in, facts out. No I/O here.

Nothing in ``proxy.core`` imports ``proxy.serve``, ``proxy.commands`` or ``proxy.config``,
opens a file or a socket, or starts a process (``tests/core/test_layers.py`` checks it).
"""
