"""Reading the logs a report is made of: the proxy's JSON lines, or another harness's.

Each file is one :class:`Run`, in one of these shapes:

* JSON lines (the proxy's ``--log-file``, ``bench``'s logs, or a harness's one call a line);
* one JSON document, indented or not: a list of calls, or a per-kind summary, an object
  whose keys are kinds (``chat``, ``tool``, ``other``) and whose values are lists of calls,
  ``{"chat": [{"ttft_ms": 162, ...}], "tool": [...]}`` (each call read as of that kind; other
  keys are ignored and named). A line of JSON lines may be such a list or summary too.

A call becomes a record when it is a JSON object that is the proxy's ``request_completed``
event or has no ``event`` at all, and that has a ``kind`` or at least one timing field
(:data:`TIMING_FIELDS`). An object without an ``event`` (another harness's) first has its
names mapped and its missing times derived (:mod:`.harness`: ``total_ms`` is ``e2e_ms``,
``tokens`` the generated tokens, ...); the renames and derivations used are counted.
Record fields still absent are unknown (``None``, as ``null`` in the proxy's own log) and
counted by name in :attr:`Run.missing`; a call without an ``outcome`` is read as
``completed`` and one without a ``kind`` as ``other`` (what the report does with them:
:mod:`.summary`).

I/O: :func:`load_runs` reads files (``.gz`` ones decompressed). The model's size for the
roofline comes from :meth:`proxy.serve.model_info.ModelInfo.fetch_blocking`.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import os
import typing
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.commands.errors import ReportError
from proxy.commands.report.harness import derive, map_names
from proxy.core.record import Kind, Record

__all__ = [
    "EVENT",
    "KIND_KEYS",
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
KIND_KEYS: tuple[str, ...] = tuple(str(k) for k in Kind)
"""The keys of a per-kind summary: the record's kinds."""
_UNKNOWN_IDENTITY: dict[str, Any] = {"id": None, "ts": None, "method": None, "path": None}
"""The identity fields a record needs, unknown until the line gives them."""


@dataclass(frozen=True, slots=True)
class Run:
    """One log file: its records, the entries skipped (by reason), the fields missing, and
    how another harness's names were read.

    ``missing`` maps a record field to the number of records whose entry lacked it (after
    the renames and derivations); ``mapped`` counts each rename used (``"total_ms ->
    e2e_ms"``), ``derived`` each field derived (:data:`.harness.DERIVED`); ``read_as``
    says how a file that is not plain JSON lines was read (``None`` for JSON lines).
    """

    name: str
    records: list[Record]
    skipped: Mapping[str, int] = field(default_factory=dict)
    missing: Mapping[str, int] = field(default_factory=dict)
    mapped: Mapping[str, int] = field(default_factory=dict)
    derived: Mapping[str, int] = field(default_factory=dict)
    read_as: str | None = None

    @property
    def skipped_total(self) -> int:
        """All skipped entries."""
        return sum(self.skipped.values())


def _is_number(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def _read_record(obj: dict[str, Any]) -> Record | str:
    """The record a log entry holds, or the reason it is skipped.

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


def _is_per_kind(obj: dict[str, Any]) -> bool:
    """A per-kind summary: ``{"chat": [calls], "tool": [calls]}``, no call itself."""
    if "event" in obj or "kind" in obj:
        return False
    return any(isinstance(obj.get(k), list) for k in KIND_KEYS)


_BAD = object()
"""What :func:`_loads` returns for bytes that are not JSON."""


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _BAD


class _Reader:
    """Accumulates one file's records from its JSON values (lines, or the one document)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.skipped: Counter[str] = Counter()
        self.missing: Counter[str] = Counter()
        self.mapped: Counter[str] = Counter()
        self.derived: Counter[str] = Counter()
        self.per_kind: Counter[str] = Counter()
        self.listed = 0
        self.lines = 0
        self.ignored: set[str] = set()

    def line(self, raw: bytes) -> None:
        line = raw.strip()
        if line:
            self.lines += 1
            value = _loads(line)
            if value is _BAD:
                self.skipped["not_json"] += 1
            else:
                self.value(value)

    def value(self, value: Any) -> None:
        """A JSON value: a call, a list of calls, or calls per kind."""
        if isinstance(value, list) and any(isinstance(item, dict) for item in value):
            self.listed += len(value)
            for item in value:
                self.call(item)
        elif isinstance(value, dict) and _is_per_kind(value):
            for kind, items in value.items():
                if kind in KIND_KEYS and isinstance(items, list):
                    self.per_kind[kind] += len(items)
                    for item in items:
                        self.call(item, kind)
            self.ignored.update(k for k in value if k not in KIND_KEYS)
        else:
            self.call(value)

    def call(self, obj: Any, kind: str | None = None) -> None:
        if not isinstance(obj, dict):
            self.skipped["not_json"] += 1
            return
        used: list[str] = []
        done: list[str] = []
        if kind is not None:
            obj = {**obj, "kind": kind}
        if "event" not in obj:
            obj, used = map_names(obj)
            obj, done = derive(obj)
        read = _read_record(obj)
        if isinstance(read, str):
            self.skipped[read] += 1
            return
        self.records.append(read)
        self.missing.update(n for n in RECORD_FIELDS if n not in obj)
        self.mapped.update(used)
        self.derived.update(done)

    def read_as(self, document: bool) -> str | None:
        """How the file was read, when it was not plain JSON lines (a file of one line
        holding a list or a per-kind summary is a JSON document on one line)."""
        document = document or self.lines == 1
        parts = []
        if self.per_kind:
            counts = ", ".join(f"{k} {n:,}" for k, n in self.per_kind.items())
            parts.append(f"calls per kind ({counts})")
        if self.listed:
            parts.append(f"a list of {self.listed:,} calls")
        if self.ignored:
            parts.append("keys ignored: " + ", ".join(sorted(self.ignored)))
        if not document:
            return "JSON lines, with " + "; ".join(parts) if parts else None
        return "a JSON document" + (": " + "; ".join(parts) if parts else "")

    def run(self, document: bool) -> Run:
        return Run(
            "",
            self.records,
            dict(self.skipped),
            dict(self.missing),
            dict(self.mapped),
            dict(self.derived),
            self.read_as(document),
        )


def _parse(lines: Iterator[bytes]) -> Run:
    """A file's lines as JSON lines, or, when its first line is the start of a JSON value
    that does not end there (an indented document), the whole file as one JSON document."""
    reader = _Reader()
    head: list[bytes] = []
    for raw in lines:
        head.append(raw)
        if raw.strip():
            break
    first = head[-1].strip() if head else b""
    if first[:1] in (b"{", b"[") and _loads(first) is _BAD:
        whole = b"".join(itertools.chain(head, lines))
        document = _loads(whole)
        if document is not _BAD:
            reader.value(document)
            return reader.run(document=True)
        head, lines = whole.splitlines(), iter(())
    for raw in itertools.chain(head, lines):
        reader.line(raw)
    return reader.run(document=False)


def _run_names(paths: Sequence[str]) -> list[str]:
    """Base names when they are unique, else the paths as given."""
    names = [os.path.basename(p) or p for p in paths]
    return names if len(set(names)) == len(names) else list(paths)


def _read_file(path: str) -> Run:
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                return _parse(iter(fh))
        with open(path, "rb") as fh:
            return _parse(iter(fh))
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except (OSError, EOFError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from None


def load_runs(paths: Sequence[str]) -> list[Run]:
    """Read each log (JSON lines or one JSON document; ``.gz`` files are decompressed) into
    a :class:`Run`.

    Entries that are not JSON objects (``not_json``), other events (``other_event``),
    entries with neither a kind nor a timing field (``no_kind_or_timing``) and entries with
    a value a record does not take (``bad_record``) are skipped and counted. Raises
    :class:`ReportError` for a file that cannot be read.
    """
    return [
        dataclasses.replace(_read_file(path), name=name)
        for path, name in zip(paths, _run_names(paths), strict=True)
    ]
