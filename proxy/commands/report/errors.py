"""The report's one error: why a report (or its plot) cannot be made."""

from __future__ import annotations

__all__ = ["ReportError"]


class ReportError(Exception):
    """The report cannot be made (unreadable file, bad argument); the message says why."""
