"""The seed's "clock" of the median chat and tool call, drawn to a PNG with matplotlib.

One row per kind: the overhead before prefill, the shaded prefill, then one tick per
decoded token across llama-server's decode time, the moment the tool call was complete and
the end of the exchange. The ticks are evenly spaced: the log has the decode total, not each
token's time, and the figure says so.

matplotlib is an optional extra (``pip install 'timing-proxy[plot]'``); it is imported only
when a plot is drawn, and only its object-oriented API is used (no pyplot, no global
backend switch): the Agg canvas renders the PNG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from proxy.core.record import Outcome, Record

if TYPE_CHECKING:
    from matplotlib.axes import Axes
from proxy.commands.report import KINDS, ReportError, _median_call, median_record

__all__ = ["PlotUnavailableError", "plot_clock"]

INSTALL_HINT = "pip install 'timing-proxy[plot]'"

_PREFILL = "#4c72b0"
_OVERHEAD = "#bbbbbb"
_DECODE = "#dd8452"
_TOOL = "#c44e52"


class PlotUnavailableError(ReportError):
    """matplotlib is not installed."""


def _calls(source: Mapping[str, Any] | Sequence[Record]) -> list[tuple[str, int, dict[str, Any]]]:
    """(kind, completed count, median call) for each kind that has one."""
    out: list[tuple[str, int, dict[str, Any]]] = []
    if isinstance(source, Mapping):
        for kind, summary in source["kinds"].items():
            call = summary.get("median_call")
            if call is not None:
                out.append((kind, int(summary["window"]), call))
        return out
    for kind in KINDS:
        done = [r for r in source if r.kind == kind and r.outcome is Outcome.COMPLETED]
        call = _median_call(median_record(done))
        if call is not None:
            out.append((kind, len(done), call))
    return out


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 or value == round(value) else f"{value:.1f}"


def plot_clock(source: Mapping[str, Any] | Sequence[Record], path: str) -> None:
    """Draw the clock of the median chat and tool call (by ``e2e_ms``) to the PNG ``path``.

    ``source`` is a :func:`proxy.commands.report.build_report` document or a sequence of records.
    Raises :class:`PlotUnavailableError` without matplotlib and :class:`ReportError` when
    there is no completed call to draw or the file cannot be written.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailableError(
            f"--plot needs matplotlib, which is not installed: {INSTALL_HINT}"
        ) from None
    calls = _calls(source)
    if not calls:
        raise ReportError("nothing to plot: no completed chat or tool call with an end time")
    fig = Figure(figsize=(11, 1.0 + 2.1 * len(calls)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(calls), 1, squeeze=False)[:, 0]
    for ax, (kind, count, call) in zip(axes, calls, strict=True):
        _draw(ax, kind, count, call)
    fig.supxlabel(
        "ms since the proxy had the request.  Prefill and decode: llama-server's clock;"
        " first token, tool call and end: the proxy's.\nOne tick per decoded token, evenly"
        " spaced over the decode time (the log has its total, not each token's time).",
        fontsize=8,
        color="#555555",
    )
    try:
        fig.savefig(path, dpi=120, format="png")
    except OSError as exc:
        raise ReportError(f"{path}: cannot write the plot: {exc}") from None


def _draw(ax: Axes, kind: str, count: int, call: Mapping[str, Any]) -> None:
    from matplotlib.ticker import StrMethodFormatter

    e2e: float = call["e2e_ms"]
    ttft: float | None = call["ttft_ms"]
    prefill: float | None = call["prefill_ms"]
    decode: float | None = call["decode_ms"]
    tokens: int | None = call["predicted_n"]
    tool_ms: float | None = call["tool_call_ms"]
    y, h = 0.0, 0.5
    parts: list[str] = []
    if ttft is not None and prefill is not None:
        start = max(ttft - prefill, 0.0)
        if start > 0:
            ax.broken_barh([(0.0, start)], (y, h), facecolors=_OVERHEAD)
            parts.append(f"overhead {_fmt(start)}")
        ax.broken_barh(
            [(start, ttft - start)],
            (y, h),
            facecolors=_PREFILL,
            alpha=0.45,
            hatch="//",
            edgecolor=_PREFILL,
        )
        ax.text(
            start + (ttft - start) / 2,
            y + h + 0.08,
            f"prefill {_fmt(prefill)} ms",
            ha="center",
            va="bottom",
            fontsize=9,
            color=_PREFILL,
        )
    elif ttft is not None:
        ax.broken_barh([(0.0, ttft)], (y, h), facecolors=_OVERHEAD)
    if prefill is not None:
        parts.append(f"prefill {_fmt(prefill)}")
    if ttft is not None and decode is not None:
        ax.broken_barh([(ttft, decode)], (y, h), facecolors=_DECODE, alpha=0.18)
        if tokens:
            step = decode / (tokens - 1) if tokens > 1 else 0.0
            ticks = [ttft + i * step for i in range(tokens)]
            ax.vlines(ticks, y - 0.05, y + h + 0.05, colors=_DECODE, linewidth=1.4, zorder=3)
        label = f"decode {_fmt(decode)} ms" + (f", {tokens} tokens" if tokens else "")
        ax.text(
            ttft + decode / 2, y - 0.12, label, ha="center", va="top", fontsize=9, color=_DECODE
        )
        parts.append(f"decode {_fmt(decode)}")
    if prefill is not None and decode is not None and prefill + decode > 0:
        share = 100.0 * prefill / (prefill + decode)
        parts[-2:] = [
            f"prefill {_fmt(prefill)} ({share:.0f} %)",
            f"decode {_fmt(decode)} ({100 - share:.0f} %)",
        ]
    if ttft is not None:
        ax.axvline(ttft, color="#333333", linewidth=0.8, linestyle=":", zorder=1)
        ax.text(ttft, y + h + 0.42, f"first token {_fmt(ttft)}", ha="center", fontsize=8)
    if tool_ms is not None:
        ax.axvline(tool_ms, color=_TOOL, linewidth=2)
        ax.text(
            tool_ms,
            y + h + 0.42,
            f"tool call complete {_fmt(tool_ms)}",
            ha="right",
            fontsize=8,
            color=_TOOL,
        )
    ax.axvline(e2e, color="black", linewidth=1)
    ax.text(e2e, y - 0.45, f"end {_fmt(e2e)}", ha="right", fontsize=8)
    rate = call["decode_tok_s"]
    name = "tool call" if kind == "tool" else kind
    title = f"{name}: median of {count} by end-to-end time ({call['id']}): {_fmt(e2e)} ms"
    if parts:
        title += ": " + " + ".join(parts) + " ms"
    if rate:
        title += f", {rate:.1f} tok/s"
    ax.set_title(title, loc="left", fontsize=10)
    ax.set_xlim(0, e2e * 1.02)
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_ylim(-0.6, 1.3)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
