"""``python -m proxy.commands.provision``: see :mod:`proxy.commands.provision.prewarm`."""

from __future__ import annotations

import sys

from proxy.commands.provision.prewarm import main

if __name__ == "__main__":
    sys.exit(main())
