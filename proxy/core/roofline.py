"""Roofline arithmetic: how far a board's decode runs above its memory-bandwidth floor.

Pure: numbers in, numbers (or text) out. The model facts come from llama-server's
``/v1/models`` ``meta`` (``size`` = bytes of the weights, ``n_params``), the board facts
from the ``[board]`` section of ``config.toml`` (spec sheet figures).

Every figure here except the measured decode rate is an *estimate*, and the text says so:

* each decoded token reads every weight once (the weights do not fit in any cache), so
  the bytes moved per token are the weights' size; KV-cache reads, activations and
  the output layer's extra work are ignored, so the real traffic is somewhat higher;
* a token costs 2 FLOP per parameter (one multiply-add), attention ignored;
* the floor is the spec bandwidth; no board reaches 100 % of it.

The Jetson measurement's figures (a 4 B model at 4.9 bit/weight on a Jetson Orin Nano 8 GB,
68 GB/s): 2.45 GB per token, 10.7 tok/s = 93.5 ms per token = 26 GB/s moved; floor 36 ms per token =
28 tok/s; the board runs at 2.6x the floor; prefill AI 333 and decode AI 3.3 against a
ridge of 18 (fp32 peak 1.25 TFLOP/s); a 10-token tool call reads 24.5 GB.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.core.boards import BOARD_PRESETS
from proxy.core.numbers import figure
from proxy.core.record import Record

__all__ = [
    "UBATCH_DEFAULT",
    "Board",
    "Medians",
    "ModelMeta",
    "decode_gbs",
    "decode_intensity",
    "floor_ms_per_token",
    "prefill_intensity",
    "record_roofline",
    "ridge",
    "roof_ratio",
    "roofline_lines",
    "roofline_summary",
    "traffic_per_json_char",
    "traffic_per_tool_call",
]

FLOP_PER_PARAM = 2.0
"""FLOP per parameter per token: one multiply-add."""

UBATCH_DEFAULT = 512
"""llama-server's default ``--ubatch-size``: the most prompt tokens one pass over the weights
evaluates, so the most a prefill pass can reuse each weight byte."""


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


@dataclass(frozen=True, slots=True)
class ModelMeta:
    """What the served model weighs: bytes of weights and parameter count."""

    size_bytes: int
    n_params: int
    name: str | None = None
    source: str = "given"
    """Where the figures came from, for the report's label."""
    n_ctx: int | None = None
    """The context of one slot (``meta.n_ctx``), when the server said."""

    @classmethod
    def from_models_json(cls, obj: Any) -> ModelMeta | None:
        """Read llama-server's ``/v1/models`` response (``data[0].meta.size``, ``.n_params``,
        ``data[0].id``); ``None`` when either number is missing or not a positive integer."""
        if not isinstance(obj, dict):
            return None
        data = obj.get("data")
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            return None
        entry = data[0]
        meta = entry.get("meta")
        if not isinstance(meta, dict):
            return None
        size = _positive_int(meta.get("size"))
        n_params = _positive_int(meta.get("n_params"))
        if size is None or n_params is None:
            return None
        name = entry.get("id")
        return cls(
            size,
            n_params,
            name if isinstance(name, str) and name else None,
            "/v1/models meta",
            _positive_int(meta.get("n_ctx")),
        )

    @property
    def bits_per_weight(self) -> float:
        """Average bits per parameter (the quantisation, as stored)."""
        return self.size_bytes * 8 / self.n_params

    @property
    def bytes_per_weight(self) -> float:
        """Average bytes per parameter."""
        return self.size_bytes / self.n_params


class BoardSettings(Protocol):
    """What ``[board]`` in ``config.toml`` holds (``proxy.config.BoardConfig`` is one)."""

    @property
    def preset(self) -> str | None: ...
    @property
    def memory_bandwidth_gbs(self) -> float: ...
    @property
    def peak_tflops(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Board:
    """The board's spec figures; ``None`` is unknown."""

    bandwidth_gbs: float | None
    peak_tflops: float | None
    name: str | None = None

    @classmethod
    def from_config(cls, config: BoardSettings) -> Board:
        """The ``[board]`` section as a Board: 0 means unknown; a preset fills what is 0."""
        bandwidth, tflops = config.memory_bandwidth_gbs, config.peak_tflops
        if config.preset is not None and config.preset in BOARD_PRESETS:
            preset_bw, preset_tflops = BOARD_PRESETS[config.preset]
            bandwidth = bandwidth or preset_bw
            tflops = tflops or preset_tflops
        return cls(_positive(bandwidth), _positive(tflops), config.preset)

    @property
    def known(self) -> bool:
        """Whether at least the bandwidth is known (the floor needs it)."""
        return self.bandwidth_gbs is not None


# -- the arithmetic ---------------------------------------------------------------------------


def decode_gbs(weight_bytes: float, decode_tok_s: float | None) -> float | None:
    """GB/s of weights read while decoding: ``weight_bytes * tok/s / 1e9``.

    An estimate: each decoded token reads every weight once; KV-cache reads are ignored.
    ``None`` when the rate is unknown or not > 0.
    """
    if decode_tok_s is None or decode_tok_s <= 0:
        return None
    return weight_bytes * decode_tok_s / 1e9


def floor_ms_per_token(weight_bytes: float, bandwidth_gbs: float | None) -> float | None:
    """The bandwidth floor: ms to read the weights once at the spec bandwidth (an estimate)."""
    if bandwidth_gbs is None or bandwidth_gbs <= 0:
        return None
    return weight_bytes / (bandwidth_gbs * 1e9) * 1000.0


def roof_ratio(decode_ms_per_token: float | None, floor_ms: float | None) -> float | None:
    """How many times the bandwidth floor a decoded token takes (1.0 = at the roof)."""
    if decode_ms_per_token is None or floor_ms is None or floor_ms <= 0:
        return None
    return decode_ms_per_token / floor_ms


def ridge(peak_tflops: float | None, bandwidth_gbs: float | None) -> float | None:
    """The ridge point in FLOP per byte: ``peak FLOP/s / bytes/s``. Above it a kernel is
    compute-bound, below it memory-bound."""
    if peak_tflops is None or bandwidth_gbs is None or peak_tflops <= 0 or bandwidth_gbs <= 0:
        return None
    return peak_tflops * 1e12 / (bandwidth_gbs * 1e9)


def prefill_intensity(n_params: int, prompt_tokens: float, weight_bytes: float) -> float:
    """FLOP per byte of weights when ``prompt_tokens`` share one pass over the weights:
    ``2 * n_params * tokens / weight_bytes`` (an estimate: attention and KV traffic ignored).

    The Jetson measurement's "AI = 100 tok x 2 flop / 0.6 B per weight = 333".
    """
    return FLOP_PER_PARAM * n_params * prompt_tokens / weight_bytes


def decode_intensity(n_params: int, weight_bytes: float) -> float:
    """FLOP per byte of weights for one decoded token: ``2 * n_params / weight_bytes``."""
    return prefill_intensity(n_params, 1, weight_bytes)


def traffic_per_tool_call(weight_bytes: float, tool_call_tokens: float) -> float:
    """Bytes of DRAM read to decode a tool call: the weights once per token (an estimate)."""
    return weight_bytes * tool_call_tokens


def traffic_per_json_char(
    weight_bytes: float, tool_call_tokens: float, json_chars: float | None
) -> float | None:
    """Bytes of DRAM read per character of the tool call's JSON (an estimate)."""
    if json_chars is None or json_chars <= 0:
        return None
    return traffic_per_tool_call(weight_bytes, tool_call_tokens) / json_chars


def record_roofline(
    record: Record, meta: ModelMeta | None, board: Board | None
) -> dict[str, float | None]:
    """The record fields ``decode_gbs`` (GB/s of weights read while decoding, est.) and
    ``roof_ratio`` (decode ms per token over the bandwidth floor, est.); ``None`` when
    unknown."""
    rate = record.decode_tok_s
    if meta is None or rate is None or rate <= 0:
        return {"decode_gbs": None, "roof_ratio": None}
    gbs = decode_gbs(meta.size_bytes, rate)
    floor = floor_ms_per_token(meta.size_bytes, board.bandwidth_gbs if board else None)
    ratio = roof_ratio(1000.0 / rate, floor)
    return {
        "decode_gbs": None if gbs is None else round(gbs, 3),
        "roof_ratio": None if ratio is None else round(ratio, 4),
    }


# -- the report's roofline section ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Medians:
    """Measured medians of one kind that the roofline uses (``None`` = not in the logs).

    ``prompt_n`` is the prompt tokens evaluated (not cached); ``tool_call_tokens`` and
    ``json_chars`` are those of the median tool call; ``energy_mj`` is the p50 board energy
    of the kind's requests (measured by the telemetry, not an estimate).
    """

    decode_tok_s: float | None = None
    prompt_n: float | None = None
    tool_call_tokens: float | None = None
    json_chars: float | None = None
    energy_mj: float | None = None


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def roofline_summary(
    meta: ModelMeta | None, board: Board | None, medians: Mapping[str, Medians]
) -> dict[str, Any]:
    """The roofline figures as JSON-ready numbers (``None`` where unknown).

    ``medians`` maps a kind (``chat``, ``tool``) to its measured medians.
    """
    bandwidth = board.bandwidth_gbs if board else None
    peak = board.peak_tflops if board else None
    out: dict[str, Any] = {
        "estimate": True,
        "model": None,
        "board": None
        if board is None
        else {"name": board.name, "bandwidth_gbs": bandwidth, "peak_tflops": peak},
        "ridge_flop_per_byte": _r(ridge(peak, bandwidth)),
        "kinds": {},
    }
    if meta is None:
        return out
    weights = meta.size_bytes
    floor = floor_ms_per_token(weights, bandwidth)
    out["model"] = {
        "name": meta.name,
        "size_bytes": weights,
        "n_params": meta.n_params,
        "bits_per_weight": _r(meta.bits_per_weight),
    }
    out["bytes_per_token"] = weights
    out["floor_ms_per_token"] = _r(floor)
    out["floor_tok_s"] = _r(1000.0 / floor) if floor else None
    out["decode_flop_per_byte"] = _r(decode_intensity(meta.n_params, weights))
    for kind, m in medians.items():
        ms_per_token = 1000.0 / m.decode_tok_s if m.decode_tok_s else None
        calls = m.tool_call_tokens
        out["kinds"][kind] = {
            "decode_tok_s": m.decode_tok_s,
            "decode_ms_per_token": _r(ms_per_token),
            "decode_gbs": _r(decode_gbs(weights, m.decode_tok_s)),
            "roof_ratio": _r(roof_ratio(ms_per_token, floor)),
            "prompt_n": m.prompt_n,
            "prefill_flop_per_byte": _r(prefill_intensity(meta.n_params, m.prompt_n, weights))
            if m.prompt_n
            else None,
            "tool_call_tokens": calls,
            "tool_call_bytes": traffic_per_tool_call(weights, calls) if calls else None,
            "json_chars": m.json_chars,
            "bytes_per_json_char": _r(traffic_per_json_char(weights, calls, m.json_chars), 1)
            if calls
            else None,
        }
    return out


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:,.2f} GB" if n_bytes < 10e9 else f"{n_bytes / 1e9:,.1f} GB"


_FAR = 4.0
"""A factor at which ">" becomes ">>" (the measurement's 333 >> 18 and 3.3 << 18)."""


def _side(intensity: float, ridge_point: float | None) -> str:
    if ridge_point is None:
        return "(ridge unknown)"
    if intensity >= ridge_point:
        sign, side = (">>" if intensity >= _FAR * ridge_point else ">"), "compute side"
    else:
        sign, side = ("<<" if intensity * _FAR <= ridge_point else "<"), "memory side"
    return f"{sign} ridge {figure(ridge_point)}: {side}"


_W = 12  # label column


def _label(name: str, text: str) -> str:
    return f"{name:<{_W}}{text}"


def _model_lines(meta: ModelMeta) -> list[str]:
    gb = _gb(meta.size_bytes)
    name = f"{meta.name}: " if meta.name else ""
    return [
        _label(
            "model",
            f"{name}{meta.n_params / 1e9:.2f} B params x {meta.bits_per_weight:.2f}"
            f" bit / 8 = {gb} of weights ({meta.source})",
        ),
        _label(
            "per token",
            f"{gb} read from DRAM per decoded token (est.: every weight once, KV cache ignored)",
        ),
    ]


def _board_lines(board: Board | None, weights: float) -> list[str]:
    """The board's spec figures and, with its bandwidth, the floor."""
    if board is None:
        return []
    bandwidth, peak = board.bandwidth_gbs, board.peak_tflops
    label = f"{board.name}: " if board.name else ""
    bw = f"{bandwidth:g} GB/s" if bandwidth else "bandwidth unknown"
    pk = f"{peak:g} TFLOP/s peak" if peak else "peak unknown"
    lines = [_label("board", f"{label}{bw}, {pk} (spec)")]
    floor = floor_ms_per_token(weights, bandwidth)
    if floor is not None:
        lines.append(
            _label(
                "floor",
                f"{_gb(weights)} / {bandwidth:g} GB/s = {figure(floor)} ms per token"
                f" = {figure(1000.0 / floor)} tok/s (est.)",
            )
        )
    return lines


def _decode_lines(kind: str, m: Medians, weights: float, floor: float | None) -> list[str]:
    """A kind's measured decode rate, the GB/s it moves and how far above the floor."""
    if not m.decode_tok_s:
        return []
    per_token = 1000.0 / m.decode_tok_s
    gbs = decode_gbs(weights, m.decode_tok_s) or 0.0
    moved = f"{_gb(weights)} / {figure(per_token)} ms = {figure(gbs)} GB/s moved (est.)"
    ratio = roof_ratio(per_token, floor)
    if ratio is not None and floor is not None:
        moved += f"; {ratio:.1f}x the floor of {figure(floor)} ms (est.)"
    return [
        _label(
            f"{kind} decode",
            f"1 / {figure(m.decode_tok_s)} tok/s = {figure(per_token)} ms"
            " per token (measured, median)",
        ),
        _label("", moved),
    ]


def _ridge_lines(board: Board | None) -> list[str]:
    if board is None:
        return []
    ridge_point = ridge(board.peak_tflops, board.bandwidth_gbs)
    if ridge_point is None:
        return []
    return [
        _label(
            "ridge",
            f"{board.peak_tflops:g} TFLOP/s / {board.bandwidth_gbs:g} GB/s"
            f" = {figure(ridge_point)} FLOP per byte (spec)",
        )
    ]


def _prefill_lines(
    meta: ModelMeta, medians: Mapping[str, Medians], ridge_point: float | None
) -> list[str]:
    """The prefill's arithmetic intensity for the median prompt (the tool kind's first)."""
    prompt = next((m.prompt_n for _, m in _tool_first(medians) if m.prompt_n), None)
    if not prompt:
        return []
    ai = prefill_intensity(meta.n_params, prompt, meta.size_bytes)
    side = f"{_side(ai, ridge_point)} " if ridge_point is not None else ""
    lines = [
        _label(
            "prefill AI",
            f"{figure(prompt)} tok x 2 FLOP / {meta.bytes_per_weight:.2f} B per weight"
            f" = {figure(ai)} FLOP per byte (est.)",
        ),
        _label("", f"{side}({figure(prompt)} = median prompt tokens evaluated, measured)"),
    ]
    if prompt > UBATCH_DEFAULT:
        capped = prefill_intensity(meta.n_params, UBATCH_DEFAULT, meta.size_bytes)
        lines.append(
            _label(
                "",
                "llama-server evaluates at most --ubatch-size tokens per pass"
                f" (512 by default): then AI <= {figure(capped)}",
            )
        )
    return lines


def _decode_ai_line(meta: ModelMeta, ridge_point: float | None) -> str:
    ai = decode_intensity(meta.n_params, meta.size_bytes)
    side = f" {_side(ai, ridge_point)}" if ridge_point is not None else ""
    return _label(
        "decode AI",
        f"2 FLOP / {meta.bytes_per_weight:.2f} B per weight = {figure(ai)} FLOP per byte"
        f" (est.){side}",
    )


def _tool_lines(weights: float, tool: Medians | None) -> list[str]:
    """The DRAM traffic of the median tool call, and per character of its JSON."""
    if tool is None or not tool.tool_call_tokens:
        return []
    calls = tool.tool_call_tokens
    traffic = traffic_per_tool_call(weights, calls)
    per_char = traffic_per_json_char(weights, calls, tool.json_chars)
    lines = [
        _label(
            "tool call",
            f"{figure(calls)} tokens x {_gb(weights)} = {_gb(traffic)} of DRAM"
            " traffic for the median tool call (est.)",
        )
    ]
    if per_char is not None and tool.json_chars:
        lines.append(
            _label(
                "",
                f"for {figure(tool.json_chars)} characters of JSON:"
                f" {_gb(per_char)} per character (est.)",
            )
        )
    else:
        lines.append(
            _label(
                "",
                "per character of JSON: unknown (the log does not carry the arguments' length)",
            )
        )
    if tool.energy_mj is not None:
        lines.append(
            _label(
                "",
                f"and {figure(tool.energy_mj / 1000.0)} J of board input energy per tool"
                " call (p50, measured)",
            )
        )
    return lines


def roofline_lines(
    meta: ModelMeta | None, board: Board | None, medians: Mapping[str, Medians]
) -> list[str]:
    """The roofline lines for ``report``, after the Jetson Orin Nano measurement's: each
    estimate says "(est.)", each median from the logs "(measured)", each data-sheet figure
    "(spec)". Figures are written by :func:`proxy.core.numbers.figure`.

    Empty when the model is unknown (the report prints how to give it instead).
    """
    if meta is None:
        return []
    weights = meta.size_bytes
    bandwidth = board.bandwidth_gbs if board else None
    ridge_point = ridge(board.peak_tflops, bandwidth) if board else None
    floor = floor_ms_per_token(weights, bandwidth)
    return [
        *_model_lines(meta),
        *_board_lines(board, weights),
        *(line for kind, m in medians.items() for line in _decode_lines(kind, m, weights, floor)),
        *_ridge_lines(board),
        *_prefill_lines(meta, medians, ridge_point),
        _decode_ai_line(meta, ridge_point),
        *_tool_lines(weights, medians.get("tool")),
    ]


def _tool_first(medians: Mapping[str, Medians]) -> list[tuple[str, Medians]]:
    """The tool kind first: the measurement's prefill AI is the tool prompt's."""
    return sorted(medians.items(), key=lambda item: item[0] != "tool")
