"""Roofline arithmetic: how far a board's decode runs above its memory-bandwidth floor, and
what its prefill achieved against its compute peaks.

Pure: numbers in, numbers out (the report renders them: ``proxy.commands.report.roofline_text``).
The model facts come from llama-server's ``/v1/models`` ``meta`` (``size`` = bytes of the
weights, ``n_params``), the board facts from :mod:`proxy.core.boards` (data-sheet figures,
each peak with its precision). The report's roofline document is
:func:`proxy.core.roofline_summary.roofline_summary`.

Every figure here except the measured rates and times is an *estimate*:

* each decoded token reads every weight once (the weights do not fit in any cache), so
  the bytes moved per token are the weights' size; KV-cache reads, activations and
  the output layer's extra work are ignored, so the real traffic is somewhat higher;
* a token costs 2 FLOP per parameter (one multiply-add), attention ignored;
* the floor is the spec bandwidth; no board reaches 100 % of it.

The Jetson measurement's figures (a 4 B model at 4.9 bit/weight on a Jetson Orin Nano 8 GB,
68 GB/s): 2.45 GB per token, 10.7 tok/s = 93.5 ms per token = 26 GB/s moved; floor 36 ms per
token = 28 tok/s; the board runs at 2.6x the floor; prefill AI 333 and decode AI 3.3 against
a ridge of 18 (FP32 peak 1.25 TFLOP/s); 8 GFLOP per token = 6.4 ms per token at that peak; a
10-token tool call reads 24.5 GB. Its median tool prefill, 796 ms for 128 prompt tokens,
achieved 2 x 4e9 x 128 / 0.796 s = 1.29 TFLOP/s: about the FP32 CUDA-core peak, 13 % of the
dense FP16 tensor-core one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.core.boards import Board, BoardSettings
from proxy.core.partials import RooflineFields
from proxy.core.record import Record

__all__ = [
    "FLOP_PER_PARAM",
    "UBATCH_DEFAULT",
    "Board",
    "BoardSettings",
    "ModelMeta",
    "achieved_tflops",
    "compute_ms_per_token",
    "decode_gbs",
    "decode_intensity",
    "floor_ms_per_token",
    "flop_per_token",
    "implied_tokens",
    "peak_share",
    "prefill_intensity",
    "record_roofline",
    "ridge",
    "roof_ratio",
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


def record_roofline(record: Record, meta: ModelMeta | None, board: Board | None) -> RooflineFields:
    """The record fields ``decode_gbs`` (GB/s of weights read while decoding, est.) and
    ``roof_ratio`` (decode ms per token over the bandwidth floor, est.); ``None`` when
    unknown."""
    rate = record.decode_tok_s
    if meta is None or rate is None or rate <= 0:
        return RooflineFields()
    gbs = decode_gbs(meta.size_bytes, rate)
    floor = floor_ms_per_token(meta.size_bytes, board.bandwidth_gbs if board else None)
    ratio = roof_ratio(1000.0 / rate, floor)
    return RooflineFields(
        decode_gbs=None if gbs is None else round(gbs, 3),
        roof_ratio=None if ratio is None else round(ratio, 4),
    )


def flop_per_token(n_params: int) -> float:
    """FLOP to evaluate one token: 2 per parameter (the measurement's "4 B params x 2 flop
    = 8 GFLOP per token"; attention ignored, an estimate)."""
    return FLOP_PER_PARAM * n_params


def compute_ms_per_token(n_params: int, tflops: float | None) -> float | None:
    """ms to evaluate one token at ``tflops``: the measurement's "FP32 peak 1.25 TFLOP/s:
    6.4 ms per token". ``None`` for an unknown peak."""
    if tflops is None or tflops <= 0:
        return None
    return flop_per_token(n_params) / (tflops * 1e12) * 1000.0


def achieved_tflops(
    n_params: int, prompt_tokens: float | None, prefill_ms: float | None
) -> float | None:
    """TFLOP/s a prefill achieved: ``2 x n_params x prompt tokens evaluated / prefill time``
    (the measurement's 2 x 4e9 x 128 / 0.796 s = 1.29). ``None`` unless both are > 0."""
    if not prompt_tokens or not prefill_ms or prompt_tokens <= 0 or prefill_ms <= 0:
        return None
    return flop_per_token(n_params) * prompt_tokens / (prefill_ms / 1000.0) / 1e12


def peak_share(tflops: float | None, peak_tflops: float | None) -> float | None:
    """``tflops`` as a share of a peak (1.0 = at the peak); ``None`` when either is unknown."""
    if tflops is None or peak_tflops is None or peak_tflops <= 0:
        return None
    return tflops / peak_tflops


def implied_tokens(extra_ms: float | None, ms_per_token: float | None) -> float | None:
    """The prompt tokens ``extra_ms`` of prefill stands for at ``ms_per_token``: the
    measurement's "658 / 6.4 = about 103 schema tokens"."""
    if extra_ms is None or ms_per_token is None or ms_per_token <= 0:
        return None
    return extra_ms / ms_per_token
