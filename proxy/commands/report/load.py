"""Reading the logs a report is made of: the proxy's JSON lines, or another harness's.

Each file is one :class:`Run`. A line becomes a record when it is a JSON object that is the
proxy's ``request_completed`` event or has no ``event`` at all (another harness's per-call
summary, say ``{"kind": "tool", "ttft_ms": 1234.5, "prefill_ms": ...}``), and that has a
``kind`` or at least one timing field (:data:`TIMING_FIELDS`). Record fields the line lacks
are unknown (``None``, as ``null`` in the proxy's own log) and counted by name in
:attr:`Run.missing`; a line without an ``outcome`` is read as ``completed`` and one without
a ``kind`` as ``other`` (what the report does with them: :mod:`.summary`).

I/O: :func:`load_runs` reads files (``.gz`` ones decompressed). The model's size for the
roofline comes from :meth:`proxy.serve.model_info.ModelInfo.fetch_blocking`.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import typing
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.commands.report.errors import ReportError
from proxy.core.record import Record

__all__ = [
    "EVENT",
    "RECORD_FIELDS",
    "TIMING_FIELDS",
    "Run",
    "load_runs",
]

EVENT = "request_completed"
"""The log event that carries a record."""

RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Record))
"""Every field of a record, in the record's order (identity first)."""

TIMING_FIELDS: tuple[str, ...] = tuple(n for n in RECORD_FIELDS if n.endswith(("_ms", "_tok_s")))
"""The record's times and rates: a line with one of them (or a kind) is a record."""

_NUMBER_FIELDS = frozenset(
    name
    for name, hint in typing.get_type_hints(Record).items()
    if (types := set(typing.get_args(hint)) - {type(None)}) and types <= {int, float}
)
"""The fields whose value, when known, is a number: a line with text there is no record."""
_UNKNOWN_IDENTITY: dict[str, Any] = {"id": None, "ts": None, "method": None, "path": None}
"""The identity fields a record needs, unknown until the line gives them."""


@dataclass(frozen=True, slots=True)
class Run:
    """One log file: its records, the lines skipped (by reason) and the fields missing.

    ``missing`` maps a record field to the number of records whose line lacked it.
    """

    name: str
    records: list[Record]
    skipped: Mapping[str, int] = field(default_factory=dict)
    missing: Mapping[str, int] = field(default_factory=dict)

    @property
    def skipped_total(self) -> int:
        """All skipped lines."""
        return sum(self.skipped.values())


def _is_number(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _read_record(obj: dict[str, Any]) -> Record | str:
    """The record a log line holds, or the reason it is skipped.

    ``other_event``: another event of the proxy's log; ``no_kind_or_timing``: neither a
    ``kind`` nor any timing field; ``bad_record``: a value a record does not take (an
    unknown kind or outcome, a time that is not a number).
    """
    event = obj.get("event")
    if event is not None and event != EVENT:
        return "other_event"
    if obj.get("kind") is None and all(obj.get(n) is None for n in TIMING_FIELDS):
        return "no_kind_or_timing"
    if not all(_is_number(obj.get(n)) for n in _NUMBER_FIELDS):
        return "bad_record"
    given = {k: v for k, v in obj.items() if v is not None or k not in ("kind", "outcome")}
    try:
        return Record.from_dict({**_UNKNOWN_IDENTITY, **given})
    except (TypeError, ValueError):
        return "bad_record"


def _parse_lines(lines: Iterable[bytes]) -> Run:
    records: list[Record] = []
    skipped: Counter[str] = Counter()
    missing: Counter[str] = Counter()
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            obj = None
        read = _read_record(obj) if isinstance(obj, dict) else "not_json"
        if isinstance(read, str):
            skipped[read] += 1
            continue
        records.append(read)
        missing.update(n for n in RECORD_FIELDS if n not in obj)
    return Run("", records, dict(skipped), dict(missing))


def _run_names(paths: Sequence[str]) -> list[str]:
    """Base names when they are unique, else the paths as given."""
    names = [os.path.basename(p) or p for p in paths]
    return names if len(set(names)) == len(names) else list(paths)


def _read_file(path: str) -> Run:
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                return _parse_lines(fh)
        with open(path, "rb") as fh:
            return _parse_lines(fh)
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except (OSError, EOFError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from None


def load_runs(paths: Sequence[str]) -> list[Run]:
    """Read each JSON-lines log (``.gz`` files are decompressed) into a :class:`Run`.

    Lines that are not JSON objects (``not_json``), other events (``other_event``), lines
    with neither a kind nor a timing field (``no_kind_or_timing``) and lines with a value a
    record does not take (``bad_record``) are skipped and counted. Raises
    :class:`ReportError` for a file that cannot be read.
    """
    return [
        dataclasses.replace(_read_file(path), name=name)
        for path, name in zip(paths, _run_names(paths), strict=True)
    ]
