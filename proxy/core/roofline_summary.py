"""The report's roofline as numbers: per kind, the decode against the bandwidth floor and the
prefill against each compute peak; and the tools' prefill from the two kinds' TTFT.

Pure: the arithmetic of :mod:`proxy.core.roofline` applied to the measured medians of each
kind; JSON-ready numbers out (``None`` where unknown). The text is the report's
(``proxy.commands.report.roofline_text``).

Peaks are named by precision (:mod:`proxy.core.boards`): a ridge, a compute time per token
and a share of the peak are given for each, since which one applies depends on the kernels
(the Jetson measurement's prefill achieved about the FP32 CUDA-core peak, 13 % of the FP16
tensor-core one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.core.boards import Board, Peak
from proxy.core.roofline import (
    ModelMeta,
    achieved_tflops,
    compute_ms_per_token,
    decode_gbs,
    decode_intensity,
    floor_ms_per_token,
    flop_per_token,
    implied_tokens,
    peak_share,
    prefill_intensity,
    ridge,
    roof_ratio,
    traffic_per_json_char,
    traffic_per_tool_call,
)

__all__ = ["REACHED", "Medians", "roofline_summary", "tools_prefill"]

REACHED = 0.5
"""The share of a peak from which a prefill counts as running at it: the highest peak it
reaches this share of is the one its kernels use (the measurement's 1.29 TFLOP/s is 101 %
of the FP32 CUDA-core peak and 13 % of the FP16 tensor one: it runs on the CUDA cores)."""


@dataclass(frozen=True, slots=True)
class Medians:
    """Measured medians of one kind that the roofline uses (``None`` = not in the logs).

    ``decode_tok_s`` is the median of the calls' own decode rates (not the median call's
    rate); ``prompt_n`` the median prompt tokens evaluated (not cached); ``prefill_ms`` and
    ``ttft_ms`` the medians of the calls'; ``tool_call_tokens`` and ``json_chars`` those of
    the median tool call; ``energy_mj`` the p50 board energy of the kind's requests.
    """

    decode_tok_s: float | None = None
    prompt_n: float | None = None
    tool_call_tokens: float | None = None
    json_chars: float | None = None
    energy_mj: float | None = None
    prefill_ms: float | None = None
    ttft_ms: float | None = None


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _board(board: Board | None) -> dict[str, Any] | None:
    if board is None:
        return None
    return {
        "name": board.name,
        "bandwidth_gbs": board.bandwidth_gbs,
        "peak_tflops": board.peak_tflops,
        "peaks": [
            {
                "precision": p.precision,
                "tflops": _r(p.tflops, 4),
                "ridge_flop_per_byte": _r(ridge(p.tflops, board.bandwidth_gbs)),
            }
            for p in board.peaks
        ],
    }


def _ms_per_token(prefill_ms: float | None, prompt_n: float | None) -> float | None:
    """The measured prefill ms per prompt token evaluated."""
    return prefill_ms / prompt_n if prefill_ms and prompt_n and prompt_n > 0 else None


def _reaches(tflops: float | None, peaks: tuple[Peak, ...]) -> str | None:
    """The precision of the highest peak ``tflops`` reaches :data:`REACHED` of."""
    reached = [p for p in peaks if (peak_share(tflops, p.tflops) or 0.0) >= REACHED]
    return max(reached, key=lambda p: p.tflops).precision if reached else None


def _prefill(meta: ModelMeta, peaks: tuple[Peak, ...], m: Medians) -> dict[str, Any]:
    """What a kind's median prefill achieved: TFLOP/s, ms per prompt token, share of each
    peak and the peak it reaches."""
    tflops = achieved_tflops(meta.n_params, m.prompt_n, m.prefill_ms)
    return {
        "prefill_ms": m.prefill_ms,
        "prefill_tflops": _r(tflops),
        "prefill_ms_per_token": _r(_ms_per_token(m.prefill_ms, m.prompt_n)),
        "prefill_shares": {p.precision: _r(peak_share(tflops, p.tflops), 4) for p in peaks}
        if tflops is not None
        else {},
        "prefill_reaches": _reaches(tflops, peaks),
    }


def _kind(
    meta: ModelMeta, floor: float | None, peaks: tuple[Peak, ...], m: Medians
) -> dict[str, Any]:
    weights = meta.size_bytes
    ms_per_token = 1000.0 / m.decode_tok_s if m.decode_tok_s else None
    calls = m.tool_call_tokens
    return {
        "decode_tok_s": m.decode_tok_s,
        "decode_ms_per_token": _r(ms_per_token),
        "decode_gbs": _r(decode_gbs(weights, m.decode_tok_s)),
        "roof_ratio": _r(roof_ratio(ms_per_token, floor)),
        "prompt_n": m.prompt_n,
        "prefill_flop_per_byte": _r(prefill_intensity(meta.n_params, m.prompt_n, weights))
        if m.prompt_n
        else None,
        **_prefill(meta, peaks, m),
        "tool_call_tokens": calls,
        "tool_call_bytes": traffic_per_tool_call(weights, calls) if calls else None,
        "json_chars": m.json_chars,
        "bytes_per_json_char": _r(traffic_per_json_char(weights, calls, m.json_chars), 1)
        if calls
        else None,
        "energy_mj": m.energy_mj,
    }


def roofline_summary(
    meta: ModelMeta | None, board: Board | None, medians: Mapping[str, Medians]
) -> dict[str, Any]:
    """The roofline figures as JSON-ready numbers (``None`` where unknown).

    ``medians`` maps a kind (``chat``, ``tool``) to its measured medians. ``board.peaks``
    each get a ridge, and (with the model) the compute time per token at that peak; each
    kind's prefill gets the TFLOP/s it achieved and its share of each peak.
    """
    bandwidth = board.bandwidth_gbs if board else None
    peaks = board.peaks if board else ()
    out: dict[str, Any] = {
        "estimate": True,
        "model": None,
        "board": _board(board),
        "ridge_flop_per_byte": _r(ridge(board.peak_tflops, bandwidth)) if board else None,
        "kinds": {},
    }
    if meta is None:
        return out
    weights = meta.size_bytes
    floor = floor_ms_per_token(weights, bandwidth)
    out["model"] = {
        "name": meta.name,
        "source": meta.source,
        "size_bytes": weights,
        "n_params": meta.n_params,
        "bits_per_weight": _r(meta.bits_per_weight),
        "bytes_per_weight": _r(meta.bytes_per_weight, 4),
    }
    out["bytes_per_token"] = weights
    out["floor_ms_per_token"] = _r(floor)
    out["floor_tok_s"] = _r(1000.0 / floor) if floor else None
    out["decode_flop_per_byte"] = _r(decode_intensity(meta.n_params, weights))
    out["flop_per_token"] = flop_per_token(meta.n_params)
    out["compute_ms_per_token"] = {
        p.precision: _r(compute_ms_per_token(meta.n_params, p.tflops), 4) for p in peaks
    }
    out["kinds"] = {kind: _kind(meta, floor, peaks, m) for kind, m in medians.items()}
    return out


def _per_token_bases(
    tool: Medians, meta: ModelMeta | None, board: Board | None
) -> list[tuple[str, float]]:
    """The ms per prefill token to turn the tools' extra prefill into tokens: the measured
    one (tool prefill p50 / prompt tokens p50) when the logs have it, else the compute time
    per token at each peak (with the model and a board)."""
    measured = _ms_per_token(tool.prefill_ms, tool.prompt_n)
    if measured is not None:
        return [("measured", measured)]
    if meta is None or board is None:
        return []
    return [
        (p.precision, ms)
        for p in board.peaks
        if (ms := compute_ms_per_token(meta.n_params, p.tflops)) is not None
    ]


def tools_prefill(
    medians: Mapping[str, Medians], meta: ModelMeta | None = None, board: Board | None = None
) -> dict[str, Any] | None:
    """The measurement's cross-check: tool TTFT p50 - chat TTFT p50 = the prefill the tools
    add to each call (an estimate: it assumes the two kinds' prompts differ by the tools
    alone), ``times_chat`` that over the chat TTFT, and the tokens it stands for at each ms
    per prefill token known (``tokens``: ``{basis, ms_per_token, tokens}``, ``basis``
    ``measured`` or a peak's precision). ``None`` without both kinds' TTFT."""
    tool, chat = medians.get("tool"), medians.get("chat")
    if tool is None or chat is None or tool.ttft_ms is None or chat.ttft_ms is None:
        return None
    extra = tool.ttft_ms - chat.ttft_ms
    return {
        "tool_ttft_ms": tool.ttft_ms,
        "chat_ttft_ms": chat.ttft_ms,
        "extra_ms": _r(extra),
        "times_chat": _r(extra / chat.ttft_ms, 2) if chat.ttft_ms > 0 else None,
        "tokens": [
            {"basis": basis, "ms_per_token": _r(ms, 4), "tokens": _r(implied_tokens(extra, ms), 1)}
            for basis, ms in _per_token_bases(tool, meta, board)
        ]
        if extra > 0
        else [],
    }
