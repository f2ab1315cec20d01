"""The one timestamp format the proxy writes: ISO 8601 in UTC with a ``Z``. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["iso_utc"]


def iso_utc(when: datetime | None = None, timespec: str = "milliseconds") -> str:
    """``when`` (default: now) as ``2026-11-30T19:42:12.345Z``."""
    when = datetime.now(UTC) if when is None else when.astimezone(UTC)
    return when.isoformat(timespec=timespec).replace("+00:00", "Z")
