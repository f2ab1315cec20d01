"""The roofline section and the tools' prefill cross-check as text, after the Jetson Orin Nano
measurement: each estimate says "(est.)", each median from the logs "(measured)", each
data-sheet figure "(spec)".

Pure: the numbers of :func:`proxy.core.roofline_summary.roofline_summary` and
:func:`proxy.core.roofline_summary.tools_prefill` in, lines out; figures are written by
:func:`proxy.core.numbers.figure`. No arithmetic beyond unit changes happens here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.core.boards import FP16_TENSOR, GIVEN
from proxy.core.numbers import figure
from proxy.core.roofline import UBATCH_DEFAULT, prefill_intensity

__all__ = ["roofline_lines", "tools_prefill_lines"]

_W = 12
"""The label column."""
_FAR = 4.0
"""A factor at which ">" becomes ">>" (the measurement's 333 >> 18 and 3.3 << 18)."""


def _label(name: str, text: str) -> str:
    return f"{name:<{_W}}{text}"


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:,.2f} GB" if n_bytes < 10e9 else f"{n_bytes / 1e9:,.1f} GB"


def _pct(share: float) -> str:
    return f"{100 * share:.0f} %"


def _peak_name(precision: str) -> str:
    """How a peak is named in a sentence: its precision, or "the given peak"."""
    return "the given peak" if precision == GIVEN else precision


def _ridges(roof: Mapping[str, Any]) -> list[tuple[str, float]]:
    board = roof["board"] or {}
    return [
        (p["precision"], p["ridge_flop_per_byte"])
        for p in board.get("peaks", [])
        if p["ridge_flop_per_byte"] is not None
    ]


def _side(intensity: float, ridge_point: float) -> tuple[str, str]:
    if intensity >= ridge_point:
        return (">>" if intensity >= _FAR * ridge_point else ">"), "compute side"
    return ("<<" if intensity * _FAR <= ridge_point else "<"), "memory side"


def _sides(intensity: float, ridges: Sequence[tuple[str, float]]) -> str:
    """Where ``intensity`` sits against each ridge: one side for all, or each its own."""
    if not ridges:
        return "(ridge unknown)"
    parts = []
    sides = set()
    for precision, point in ridges:
        sign, side = _side(intensity, point)
        sides.add(side)
        name = "" if precision == GIVEN else f" ({precision})"
        parts.append((f"{sign} ridge {figure(point)}{name}", side))
    if len(sides) == 1:
        return ", ".join(p for p, _ in parts) + f": {sides.pop()}"
    return "; ".join(f"{p}: {side}" for p, side in parts)


def _model_lines(model: Mapping[str, Any]) -> list[str]:
    gb = _gb(model["size_bytes"])
    name = f"{model['name']}: " if model["name"] else ""
    return [
        _label(
            "model",
            f"{name}{model['n_params'] / 1e9:.2f} B params x {model['bits_per_weight']:.2f}"
            f" bit / 8 = {gb} of weights ({model['source']})",
        ),
        _label(
            "per token",
            f"{gb} read from DRAM per decoded token (est.: every weight once, KV cache ignored)",
        ),
    ]


def _tok_s(rate: float) -> str:
    """A decode rate with one decimal, as the measurement writes it (``6.0 tok/s``)."""
    return f"{rate:,.1f}"


def _peaks_text(peaks: Sequence[Mapping[str, Any]]) -> str:
    if len(peaks) == 1 and peaks[0]["precision"] == GIVEN:
        return f"{figure(peaks[0]['tflops'])} TFLOP/s (given; its precision not stated)"
    return ", ".join(f"{figure(p['tflops'])} TFLOP/s {p['precision']}" for p in peaks) + " (spec)"


def _board_lines(roof: Mapping[str, Any]) -> list[str]:
    """The board's spec figures and, with its bandwidth and the model, the floor."""
    board = roof["board"]
    if board is None:
        return []
    bandwidth = board["bandwidth_gbs"]
    label = f"{board['name']}: " if board["name"] else ""
    bw = f"{bandwidth:g} GB/s (spec)" if bandwidth else "bandwidth unknown"
    lines = [_label("board", f"{label}{bw}")]
    peaks = board["peaks"]
    lines.append(_label("peaks", _peaks_text(peaks) if peaks else "unknown"))
    floor = roof.get("floor_ms_per_token")
    if floor:
        lines.append(
            _label(
                "floor",
                f"{_gb(roof['bytes_per_token'])} / {bandwidth:g} GB/s = {figure(floor)} ms per"
                f" token = {figure(roof['floor_tok_s'])} tok/s (est.)",
            )
        )
    return lines


def _decode_lines(kind: str, k: Mapping[str, Any], roof: Mapping[str, Any]) -> list[str]:
    """A kind's measured decode rate, the GB/s it moves and how far above the floor."""
    rate = k["decode_tok_s"]
    if not rate:
        return []
    per_token = k["decode_ms_per_token"]
    moved = (
        f"{_gb(roof['bytes_per_token'])} / {figure(per_token)} ms ="
        f" {figure(k['decode_gbs'])} GB/s moved (est.)"
    )
    if k["roof_ratio"] is not None:
        moved += f"; {k['roof_ratio']:.1f}x the floor of {figure(roof['floor_ms_per_token'])} ms"
    return [
        _label(
            f"{kind} decode",
            f"1 / {_tok_s(rate)} tok/s = {figure(per_token)} ms per token"
            " (measured: the median of the calls' rates)",
        ),
        _label("", moved),
    ]


def _ridge_lines(roof: Mapping[str, Any]) -> list[str]:
    board = roof["board"]
    if board is None or not board["bandwidth_gbs"]:
        return []
    lines: list[str] = []
    for p in board["peaks"]:
        if p["ridge_flop_per_byte"] is None:
            continue
        name = "" if p["precision"] == GIVEN else f"{p['precision']}: "
        lines.append(
            _label(
                "ridge" if not lines else "",
                f"{name}{figure(p['tflops'])} TFLOP/s / {board['bandwidth_gbs']:g} GB/s"
                f" = {figure(p['ridge_flop_per_byte'])} FLOP per byte (spec)",
            )
        )
    return lines


def _compute_line(roof: Mapping[str, Any]) -> list[str]:
    """The compute time of one token at each peak: the measurement's "6.4 ms per token"."""
    at = roof.get("compute_ms_per_token") or {}
    model = roof["model"]
    lines = [
        _label(
            "compute",
            f"2 x {model['n_params'] / 1e9:.2f} B params = {roof['flop_per_token'] / 1e9:.2f}"
            " GFLOP per token (est.)",
        )
    ]
    if at:
        times = ", ".join(f"{figure(ms)} ms at {_peak_name(p)}" for p, ms in at.items())
        lines.append(_label("", f"per token: {times} (spec)"))
    return lines


def _tool_first(kinds: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """The tool kind first: the measurement's prefill figures are the tool prompt's."""
    return sorted(kinds.items(), key=lambda item: item[0] != "tool")


def _verdict(k: Mapping[str, Any]) -> list[str]:
    """Which peak the prefill runs at, when it reaches one that is not the highest."""
    reached = k["prefill_reaches"]
    shares: Mapping[str, float] = k["prefill_shares"]
    top = min(shares, key=lambda p: shares[p], default=None)
    if reached is None or top is None or reached == top:
        return []
    why = (
        "its kernels do not reach the tensor cores"
        if top == FP16_TENSOR
        else f"it does not reach the {top} peak"
    )
    return [_label("", f"about the {reached} peak: {why} (est.)")]


def _achieved_lines(kind: str, k: Mapping[str, Any], n_params: int) -> list[str]:
    """What a kind's median prefill achieved (``2 x params x tokens / time``)."""
    tflops = k["prefill_tflops"]
    if tflops is None:
        return []
    lines = [
        _label(
            "prefill",
            f"{kind}: 2 x {n_params / 1e9:.2f} B x {figure(k['prompt_n'])} tok"
            f" / {figure(k['prefill_ms'])} ms = {figure(tflops)} TFLOP/s achieved"
            " (measured medians)",
        )
    ]
    shares = ", ".join(f"{_pct(s)} of {_peak_name(p)}" for p, s in k["prefill_shares"].items())
    if shares:
        lines.append(_label("", f"= {shares} (measured / spec)"))
    lines.append(
        _label(
            "",
            f"{figure(k['prefill_ms'])} / {figure(k['prompt_n'])} ="
            f" {figure(k['prefill_ms_per_token'])} ms per prompt token (measured)",
        )
    )
    return [*lines, *_verdict(k)]


def _prefill_lines(roof: Mapping[str, Any]) -> list[str]:
    """Each kind's achieved prefill compute, or why it is unknown."""
    n_params = roof["model"]["n_params"]
    kinds = _tool_first(roof["kinds"])
    lines = [line for kind, k in kinds for line in _achieved_lines(kind, k, n_params)]
    if not lines and any(k["prefill_ms"] is not None for _, k in kinds):
        lines.append(
            _label(
                "prefill",
                "compute achieved: unknown (the logs carry no prompt tokens evaluated, prompt_n)",
            )
        )
    return lines


def _intensity_lines(roof: Mapping[str, Any]) -> list[str]:
    """The prefill's arithmetic intensity for the median prompt (the tool kind's first)."""
    model = roof["model"]
    prompt = next((k["prompt_n"] for _, k in _tool_first(roof["kinds"]) if k["prompt_n"]), None)
    ridges = _ridges(roof)
    lines = []
    if prompt:
        where = f"({figure(prompt)} = median prompt tokens evaluated, measured)"
        ai = prefill_intensity(model["n_params"], prompt, model["size_bytes"])
        lines += [
            _label(
                "prefill AI",
                f"{figure(prompt)} tok x 2 FLOP / {model['bytes_per_weight']:.2f} B per weight"
                f" = {figure(ai)} FLOP per byte (est.)",
            ),
            *([_label("", _sides(ai, ridges))] if ridges else []),
            _label("", where),
        ]
        if prompt > UBATCH_DEFAULT:
            capped = prefill_intensity(model["n_params"], UBATCH_DEFAULT, model["size_bytes"])
            lines.append(
                _label(
                    "",
                    "llama-server evaluates at most --ubatch-size tokens per pass"
                    f" (512 by default): then AI <= {figure(capped)}",
                )
            )
    decode_ai = roof["decode_flop_per_byte"]
    lines.append(
        _label(
            "decode AI",
            f"2 FLOP / {model['bytes_per_weight']:.2f} B per weight = {figure(decode_ai)} FLOP"
            " per byte (est.)",
        )
    )
    if ridges:
        lines.append(_label("", _sides(decode_ai, ridges)))
    return lines


def _tool_lines(roof: Mapping[str, Any]) -> list[str]:
    """The DRAM traffic of the median tool call, and per character of its JSON."""
    tool = roof["kinds"].get("tool")
    if tool is None or not tool["tool_call_tokens"]:
        return []
    lines = [
        _label(
            "tool call",
            f"{figure(tool['tool_call_tokens'])} tokens x {_gb(roof['bytes_per_token'])} ="
            f" {_gb(tool['tool_call_bytes'])} of DRAM traffic for the median tool call (est.)",
        )
    ]
    if tool["bytes_per_json_char"] is not None and tool["json_chars"]:
        lines.append(
            _label(
                "",
                f"for {figure(tool['json_chars'])} characters of JSON:"
                f" {_gb(tool['bytes_per_json_char'])} per character (est.)",
            )
        )
    else:
        lines.append(
            _label(
                "",
                "per character of JSON: unknown (the log does not carry the arguments' length)",
            )
        )
    if tool["energy_mj"] is not None:
        lines.append(
            _label(
                "",
                f"and {figure(tool['energy_mj'] / 1000.0)} J of board input energy per tool"
                " call (p50, measured)",
            )
        )
    return lines


def roofline_lines(roof: Mapping[str, Any]) -> list[str]:
    """The roofline lines of a :func:`proxy.core.roofline_summary.roofline_summary`
    document; empty when the model is unknown (the report prints how to give it instead)."""
    if roof["model"] is None:
        return []
    return [
        *_model_lines(roof["model"]),
        *_board_lines(roof),
        *(line for kind, k in roof["kinds"].items() for line in _decode_lines(kind, k, roof)),
        *_ridge_lines(roof),
        *_compute_line(roof),
        *_prefill_lines(roof),
        *_intensity_lines(roof),
        *_tool_lines(roof),
    ]


def _tokens_lines(tokens: Sequence[Mapping[str, Any]]) -> list[str]:
    """The tokens the extra prefill stands for: at the measured ms per prompt token, or at
    each peak's compute time per token (the lowest peak first: the most tokens)."""
    if not tokens:
        return []
    if tokens[0]["basis"] == "measured":
        t = tokens[0]
        return [
            f"  = about {figure(round(t['tokens']))} tokens at the measured"
            f" {figure(t['ms_per_token'])} ms per prompt token (tool prefill / prompt_n, p50s)"
        ]
    lines = [
        f"  = about {figure(round(t['tokens']))} tokens at {figure(t['ms_per_token'])} ms per"
        f" token, the compute time at {_peak_name(t['basis'])} (est.)"
        for t in sorted(tokens, key=lambda t: -t["ms_per_token"])
    ]
    return [*lines, "    (which peak the prefill runs at needs prompt_n, which these logs lack)"]


def tools_prefill_lines(check: Mapping[str, Any] | None) -> list[str]:
    """The cross-check of the measurement: tool TTFT - chat TTFT, the prefill the tools add
    to each call; nothing without both kinds' TTFT."""
    if check is None:
        return []
    extra = check["extra_ms"]
    head = f"cross-check: tool TTFT - chat TTFT = {figure(extra)} ms"
    if extra <= 0:
        return [f"{head}: the tool calls start no later than chat (tools cached, or no cost)"]
    times = f", {check['times_chat']:.1f}x the chat TTFT" if check["times_chat"] else ""
    return [
        f"{head} of prefill per call for the tools (est.)",
        f"  {figure(check['tool_ttft_ms'])} - {figure(check['chat_ttft_ms'])} ms{times};"
        " assumes the two kinds' prompts differ by the tools alone",
        *_tokens_lines(check["tokens"]),
    ]
