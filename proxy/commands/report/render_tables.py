"""The report's tables beside the kinds: each run's medians, each API's, why prefill was paid
(findings and conversations) and the setup findings.

Pure: parts of a :func:`proxy.commands.report.summary.build_report` document in, lines out.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.commands.report.textfmt import COL as _COL
from proxy.commands.report.textfmt import WIDTH as _WIDTH
from proxy.commands.report.textfmt import Format as _Format
from proxy.commands.report.textfmt import integer as _int
from proxy.commands.report.textfmt import ms as _ms
from proxy.commands.report.textfmt import plural as _plural
from proxy.commands.report.textfmt import rate as _rate

__all__ = ["by_api_lines", "per_run_lines", "prefill_lines", "setup_lines"]

_FINDINGS_SHOWN = 10
"""How many findings the text lists (``--json`` has them all)."""

_RUN_COLS: tuple[tuple[str, str, _Format], ...] = (
    ("e2e_ms", "e2e ms", _ms),
    ("tool_call_ms", "tool ms", _ms),
    ("ttft_ms", "TTFT ms", _ms),
    ("prefill_ms", "prefill ms", _ms),
    ("decode_ms", "decode ms", _ms),
    ("decode_tok_s", "tok/s", _rate),
)
_API_COLS: tuple[tuple[str, str, _Format], ...] = (
    ("ttft_ms", "TTFT ms", _ms),
    ("prefill_ms", "prefill ms", _ms),
    ("e2e_ms", "e2e ms", _ms),
    ("tool_call_ms", "tool ms", _ms),
    ("decode_tok_s", "tok/s", _rate),
)
"""The medians the per-API table shows (``--json`` has every percentile)."""


def _spread_lines(rows: Sequence[Mapping[str, Any]], spread: Mapping[str, Any]) -> list[str]:
    main = next((name for name in ("tool_call_ms", "e2e_ms") if spread.get(name)), None)
    if main is None:
        return []
    sp = spread[main]
    medians = " / ".join(_ms(row[main]) for row in rows if row[main] is not None)
    return [
        f"  spread between the runs' {main} medians: {medians} ms",
        f"  max - min = {_ms(sp['ms'])} ms, {sp['pct']:.1f} % of the median run",
    ]


def per_run_lines(kind: str, per_run: Mapping[str, Any]) -> list[str]:
    rows = per_run["runs"]
    cols = [c for c in _RUN_COLS if any(row[c[0]] is not None for row in rows)]
    if not cols:
        return []
    width = max(12, *(len(row["name"]) for row in rows))
    head = f"  {'run':<{width}}{'n':>6}" + "".join(f"{label:>{_COL + 2}}" for _, label, _ in cols)
    lines = [f"{kind} per run (medians of completed requests)", head]
    for row in rows:
        lines.append(
            f"  {row['name']:<{width}}{row['count']:>6,}"
            + "".join(f"{fmt(row[name]):>{_COL + 2}}" for name, _, fmt in cols)
        )
    spread = per_run["spread"]
    cells = ["-" if spread[name] is None else fmt(spread[name]["ms"]) for name, _, fmt in cols]
    lines.append(f"  {'spread':<{width}}{'':>6}" + "".join(f"{c:>{_COL + 2}}" for c in cells))
    return [*lines, *_spread_lines(rows, spread)]


def _api_rows(by_api: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(api, kind, summary) of each kind each API had requests of."""
    return [
        (api, kind, s)
        for api, entry in by_api.items()
        for kind, s in entry["kinds"].items()
        if s["count"]
    ]


def by_api_lines(report: Mapping[str, Any]) -> list[str]:
    """The medians of each API's chat and tool requests, one row per API and kind (only
    those with requests); nothing for logs that do not name the API."""
    by_api: Mapping[str, Any] = report.get("by_api") or {}
    rows = _api_rows(by_api) if set(by_api) - {"unknown"} else []
    if not rows:
        return []
    cols = [c for c in _API_COLS if any(s[c[0]]["p50"] is not None for _, _, s in rows)]
    width = max(12, *(len(api) for api, _, _ in rows))
    head = f"  {'api':<{width}}  {'kind':<6}{'requests':>9}{'completed':>10}" + "".join(
        f"{label:>{_COL + 1}}" for _, label, _ in cols
    )
    lines = ["per API (medians of completed requests)", head]
    for api, kind, s in rows:
        lines.append(
            f"  {api:<{width}}  {kind:<6}{s['count']:>9,}{s['window']:>10,}"
            + "".join(f"{fmt(s[name]['p50']):>{_COL + 1}}" for name, _, fmt in cols)
        )
    return lines


def _finding_lines(found: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per finding (cause, section, requests, tokens, ms), its fix wrapped below."""
    shown = found[:_FINDINGS_SHOWN]
    cause_w = max(5, *(len(f["cause"]) for f in shown))
    section_w = max(7, *(len(f["section"] or "-") for f in shown))
    nums = ("requests", "tokens", "ms lost")
    lines = [
        f"  {'cause':<{cause_w}}  {'section':<{section_w}}" + "".join(f"{n:>10}" for n in nums)
    ]
    for f in shown:
        cells = (_int(f["requests"]), _int(f["lost_tokens"]), _ms(f["lost_ms"]))
        lines.append(
            f"  {f['cause']:<{cause_w}}  {f['section'] or '-':<{section_w}}"
            + "".join(f"{c:>10}" for c in cells)
        )
        lines.extend(
            textwrap.wrap(
                f["fix"],
                _WIDTH,
                initial_indent="    fix: ",
                subsequent_indent="         ",
                break_on_hyphens=False,
                break_long_words=False,
            )
        )
    more = len(found) - len(shown)
    if more:
        lines.append(f"  and {_plural(more, 'finding')} more (all in --json)")
    return lines


def _conversation_lines(report: Mapping[str, Any]) -> list[str]:
    """The conversations that lost the most prefill: turns, requests, prefill paid, lost."""
    talks: Mapping[str, Mapping[str, Any]] = report.get("conversations") or {}
    if not talks:
        return []
    seen = report.get("conversations_seen") or len(talks)
    width = max(12, *(len(name) for name in talks))
    cols = ("turns", "requests", "prefill ms", "lost ms")
    lost = any(t["lost_ms"] for t in talks.values())
    which = "lost the most prefill to misses" if lost else "paid the most prefill (none lost any)"
    lines = [
        f"conversations: the {len(talks):,} of {seen:,} that {which}",
        f"  {'conversation':<{width}}" + "".join(f"{c:>12}" for c in cols),
    ]
    for name, t in talks.items():
        cells = (_int(t["turns"]), _int(t["requests"]), _ms(t["prefill_ms"]), _ms(t["lost_ms"]))
        lines.append(f"  {name:<{width}}" + "".join(f"{c:>12}" for c in cells))
    return lines


def prefill_lines(report: Mapping[str, Any]) -> list[str]:
    """Why prefill was paid: the findings with their fixes, then the conversations. Nothing
    for logs without a prefix attribution."""
    attributed = report.get("attributed") or 0
    found: Sequence[Mapping[str, Any]] = report.get("findings") or []
    if not attributed and not found:
        return []
    lines = ["", f"why prefill was paid ({_plural(attributed, 'request')} attributed)"]
    if found:
        lines.append("  ms lost: the prefill paid again, at the proxy's reference prefill rate")
        lines.extend(_finding_lines(found))
    else:
        lines.append("  no prefill was lost to a cache miss")
    talks = _conversation_lines(report)
    return [*lines, *([""] if talks else []), *talks]


def setup_lines(report: Mapping[str, Any]) -> list[str]:
    """The setup findings, first in the report: one line each, its fix wrapped below."""
    found: Sequence[Mapping[str, Any]] = report.get("setup_findings") or []
    if not found:
        return []
    lines = ["setup findings (fix these first)"]
    for f in found:
        what = f"{f['cause']} ({f['model']}): {_plural(f['requests'], 'request')}"
        if f["ms"]:
            what += f", {_ms(f['ms'])} ms"
        detail = f.get("detail") or {}
        if detail.get("longest_tokens") is not None and f["cause"] == "no_max_tokens":
            what += f", longest generation {_int(detail['longest_tokens'])} tokens"
        if "tool_decode_tok_s" in detail:
            what += (
                f": tool calls {_rate(detail['tool_decode_tok_s'])} tok/s against chat"
                f" {_rate(detail['chat_decode_tok_s'])} (spread {_rate(detail['spread_tok_s'])})"
            )
        lines.append("  " + what)
        lines.extend(
            textwrap.wrap(
                f["fix"],
                _WIDTH,
                initial_indent="    fix: ",
                subsequent_indent="         ",
                break_on_hyphens=False,
                break_long_words=False,
            )
        )
    return [*lines, ""]
