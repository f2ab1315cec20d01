"""``python -m proxy`` runs the ``timing-proxy`` command."""

from __future__ import annotations

import sys

from proxy.commands.cli import main

sys.exit(main())
