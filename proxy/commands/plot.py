"""The "clock" of the median chat and tool call, drawn to a PNG with matplotlib.

One row per kind: the overhead before prefill, the shaded prefill, then one tick per
decoded token across llama-server's decode time, the moment the tool call was complete and
the end of the exchange. The ticks are evenly spaced: the log has the decode total, not each
token's time, and the figure says so.

matplotlib is an optional extra (``pip install 'timing-proxy[plot]'``); it is imported only
when a plot is drawn, and only its object-oriented API is used (no pyplot, no global
backend switch): the Agg canvas renders the PNG. The median calls come from
:mod:`proxy.commands.report.summary`; :mod:`proxy.commands.report.run` imports this module,
and this module imports only the report's summary and errors, so the imports run one way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from proxy.commands.errors import ReportError
from proxy.commands.report.summary import KINDS, completed, median_call, median_record
from proxy.core.numbers import figure
from proxy.core.record import Record
from proxy.core.summaries import percentile

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["PlotUnavailableError", "clock_title", "plot_clock"]

INSTALL_HINT = "pip install 'timing-proxy[plot]'"

_PREFILL = "#4c72b0"
_OVERHEAD = "#bbbbbb"
_DECODE = "#dd8452"
_TOOL = "#c44e52"


class PlotUnavailableError(ReportError):
    """matplotlib is not installed."""


_Call = tuple[str, int, dict[str, Any], float | None]
"""(kind, completed count, median call, the median of the calls' decode rates)."""


def _calls(source: Mapping[str, Any] | Sequence[Record]) -> list[_Call]:
    """The median call of each kind that has one, with the kind's completed count and the
    median of its calls' decode rates."""
    out: list[_Call] = []
    if isinstance(source, Mapping):
        for kind, summary in source["kinds"].items():
            call = summary.get("median_call")
            if call is not None:
                rate = (summary.get("decode_tok_s") or {}).get("p50")
                out.append((kind, int(summary["window"]), call, rate))
        return out
    for kind in KINDS:
        done = completed(source, kind)
        call = median_call(median_record(done))
        if call is not None:
            rates = sorted(r.decode_tok_s for r in done if r.decode_tok_s is not None)
            out.append((kind, len(done), call, percentile(rates, 0.5)))
    return out


def _lacking(source: Mapping[str, Any] | Sequence[Record]) -> str:
    """Why there is no call to draw: no completed chat or tool call, or none with an end."""
    if isinstance(source, Mapping):
        done = sum(int(s["window"]) for s in source["kinds"].values())
    else:
        done = sum(len(completed(source, kind)) for kind in KINDS)
    if not done:
        return (
            "nothing to plot: no completed chat or tool call in the logs (a call needs a kind,"
            " chat or tool, and no failed outcome)"
        )
    return (
        f"nothing to plot: none of the {done:,} completed chat and tool calls has an end-to-end"
        " time (e2e_ms; a harness's total_ms, latency_ms or duration_ms is read as it), which"
        " picks the median call"
    )


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
        raise ReportError(_lacking(source))
    fig = Figure(figsize=(11, 1.0 + 2.1 * len(calls)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(calls), 1, squeeze=False)[:, 0]
    for ax, (kind, count, call, rate) in zip(axes, calls, strict=True):
        _draw(ax, kind, count, call, rate)
    fig.supxlabel(
        _caption(source),
        fontsize=8,
        color="#555555",
    )
    try:
        fig.savefig(path, dpi=120, format="png")
    except OSError as exc:
        raise ReportError(f"{path}: cannot write the plot: {exc}") from None


_TICKS = (
    "One tick per decoded token, evenly spaced over the decode time (the log has its total,"
    " not each token's time)."
)


def _caption(source: Mapping[str, Any] | Sequence[Record]) -> str:
    """Whose clocks the figure shows: the proxy's log, or a harness's times with prefill
    and decode derived from them."""
    if isinstance(source, Mapping) and source.get("derived"):
        return (
            "ms since the request was sent.  Times: the logs' own; prefill = TTFT and"
            " decode = end - TTFT where the logs lacked them (an upper bound on prefill).\n"
            + _TICKS
        )
    return (
        "ms since the proxy had the request.  Prefill and decode: llama-server's clock;"
        " first token, tool call and end: the proxy's.\n" + _TICKS
    )


_Y, _H = 0.0, 0.5
"""The bar's bottom and height on each row's y axis."""


def _draw(
    ax: Axes, kind: str, count: int, call: Mapping[str, Any], calls_rate: float | None
) -> None:
    _draw_prefill(ax, call["ttft_ms"], call["prefill_ms"])
    _draw_decode(ax, call["ttft_ms"], call["decode_ms"], call["predicted_n"])
    _draw_marks(ax, call["ttft_ms"], call["tool_call_ms"], call["e2e_ms"])
    ax.set_title(clock_title(kind, count, call, calls_rate), loc="left", fontsize=10)
    _style_axis(ax, call["e2e_ms"])


def _draw_prefill(ax: Axes, ttft: float | None, prefill: float | None) -> None:
    """The overhead before prefill (grey) and the shaded prefill up to the first token."""
    if ttft is None:
        return
    if prefill is None:
        ax.broken_barh([(0.0, ttft)], (_Y, _H), facecolors=_OVERHEAD)
        return
    start = max(ttft - prefill, 0.0)
    if start > 0:
        ax.broken_barh([(0.0, start)], (_Y, _H), facecolors=_OVERHEAD)
    ax.broken_barh(
        [(start, ttft - start)],
        (_Y, _H),
        facecolors=_PREFILL,
        alpha=0.45,
        hatch="//",
        edgecolor=_PREFILL,
    )
    ax.text(
        start + (ttft - start) / 2,
        _Y + _H + 0.08,
        f"prefill {figure(prefill)} ms",
        ha="center",
        va="bottom",
        fontsize=9,
        color=_PREFILL,
    )


def _draw_decode(ax: Axes, ttft: float | None, decode: float | None, tokens: int | None) -> None:
    """The decode time after the first token, one tick per decoded token, evenly spaced."""
    if ttft is None or decode is None:
        return
    ax.broken_barh([(ttft, decode)], (_Y, _H), facecolors=_DECODE, alpha=0.18)
    if tokens:
        step = decode / (tokens - 1) if tokens > 1 else 0.0
        ticks = [ttft + i * step for i in range(tokens)]
        ax.vlines(ticks, _Y - 0.05, _Y + _H + 0.05, colors=_DECODE, linewidth=1.4, zorder=3)
    label = f"decode {figure(decode)} ms" + (f", {tokens} tokens" if tokens else "")
    ax.text(ttft + decode / 2, _Y - 0.12, label, ha="center", va="top", fontsize=9, color=_DECODE)


def _draw_marks(ax: Axes, ttft: float | None, tool_ms: float | None, e2e: float) -> None:
    """The first token, the moment the tool call was complete, and the end."""
    if ttft is not None:
        ax.axvline(ttft, color="#333333", linewidth=0.8, linestyle=":", zorder=1)
        ax.text(ttft, _Y + _H + 0.42, f"first token {figure(ttft)}", ha="center", fontsize=8)
    if tool_ms is not None:
        ax.axvline(tool_ms, color=_TOOL, linewidth=2)
        ax.text(
            tool_ms,
            _Y + _H + 0.42,
            f"tool call complete {figure(tool_ms)}",
            ha="right",
            fontsize=8,
            color=_TOOL,
        )
    ax.axvline(e2e, color="black", linewidth=1)
    ax.text(e2e, _Y - 0.45, f"end {figure(e2e)}", ha="right", fontsize=8)


def _title_parts(ttft: float | None, prefill: float | None, decode: float | None) -> list[str]:
    """The title's "overhead + prefill (share) + decode (share)", of what is known."""
    parts: list[str] = []
    if ttft is not None and prefill is not None and ttft - prefill > 0:
        parts.append(f"overhead {figure(ttft - prefill)}")
    if prefill is not None and decode is not None and prefill + decode > 0:
        share = 100.0 * prefill / (prefill + decode)
        return [
            *parts,
            f"prefill {figure(prefill)} ({share:.0f} %)",
            f"decode {figure(decode)} ({100 - share:.0f} %)",
        ]
    if prefill is not None:
        parts.append(f"prefill {figure(prefill)}")
    if ttft is not None and decode is not None:
        parts.append(f"decode {figure(decode)}")
    return parts


def clock_title(kind: str, count: int, call: Mapping[str, Any], calls_rate: float | None) -> str:
    """A row's title: the median call's end-to-end time and split, then its own decode rate
    beside the median of the ``count`` calls' rates (``calls_rate``), named as such."""
    name = "tool call" if kind == "tool" else kind
    call_id = call["id"] if call["id"] is not None else "no id"
    title = f"{name}: median of {count} by end-to-end time ({call_id}): {figure(call['e2e_ms'])} ms"
    parts = _title_parts(call["ttft_ms"], call["prefill_ms"], call["decode_ms"])
    if parts:
        title += ": " + " + ".join(parts) + " ms"
    if call["decode_tok_s"]:
        title += f"\ndecode {call['decode_tok_s']:.1f} tok/s: this call's own rate"
        if calls_rate is not None:
            title += f" (the median of the {count} calls' rates is {calls_rate:.1f})"
    return title


def _style_axis(ax: Axes, e2e: float) -> None:
    from matplotlib.ticker import StrMethodFormatter

    ax.set_xlim(0, e2e * 1.02)
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.set_ylim(-0.6, 1.3)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
