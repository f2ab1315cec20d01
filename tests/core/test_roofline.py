"""Tests for proxy.core.roofline, proxy.core.roofline_summary and proxy.core.boards: the
arithmetic against the Jetson measurement's own figures, the peaks by precision, and the
report's roofline lines (proxy.commands.report.roofline_text)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.commands.report.roofline_text import roofline_lines as render_lines
from proxy.commands.report.roofline_text import tools_prefill_lines
from proxy.config import BOARD_PRESETS, BoardConfig
from proxy.core.boards import BOARD_SPECS, FP16_TENSOR, FP32_CUDA, GIVEN, Peak
from proxy.core.partials import RooflineFields
from proxy.core.record import Kind, Record
from proxy.core.roofline import (
    Board,
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
    record_roofline,
    ridge,
    roof_ratio,
    traffic_per_json_char,
    traffic_per_tool_call,
)
from proxy.core.roofline_summary import Medians, roofline_summary, tools_prefill

# The Jetson Orin Nano measurement this project starts from, as published (the figures in
# proxy/core/roofline.py's docstring): a 4 B model whose weights are 2.45 GB (4.9 bit/weight)
# on a Jetson Orin Nano 8 GB (68 GB/s, fp32 peak 1.25 TFLOP/s); chat decode 10.7 tok/s =
# 93.5 ms per token = 26 GB/s moved; floor 36 ms per token = 28 tok/s; 2.6x the floor;
# decode AI 3.3 against a ridge of 18; a 10-token tool call reads 24.5 GB.
N_PARAMS = 4_000_000_000
WEIGHTS = 2_450_000_000
SEED_META = ModelMeta(WEIGHTS, N_PARAMS, "qwen3-4b")
SEED_BOARD = Board(68.0, (Peak(1.25, FP32_CUDA),))
"""The board as the measurement's arithmetic took it: 68 GB/s and the FP32 peak, 1.25."""
ORIN = Board.from_config(BoardConfig(preset="jetson-orin-nano-8gb"))
"""The preset: both peaks, FP16 tensor (10.24) and FP32 CUDA cores (1.28)."""
CHAT_DECODE_TOK_S = 10.7


def models_json(**meta: Any) -> dict[str, Any]:
    """A llama-server /v1/models answer with the given meta."""
    return {
        "object": "list",
        "models": [{"name": "m", "model": "m"}],
        "data": [
            {
                "id": "qwen3-4b.gguf",
                "object": "model",
                "owned_by": "llamacpp",
                "meta": {"vocab_type": 2, "n_vocab": 151936, "n_ctx": 4096, **meta},
            }
        ],
    }


def roofline_lines(
    meta: ModelMeta | None, board: Board | None, medians: dict[str, Medians]
) -> list[str]:
    """The report's roofline lines for these figures (the summary, rendered)."""
    return render_lines(roofline_summary(meta, board, medians))


def chat_summary() -> dict[str, Any]:
    """The roofline summary for the measurement's chat decode rate on its board."""
    medians = {"chat": Medians(decode_tok_s=CHAT_DECODE_TOK_S)}
    return roofline_summary(SEED_META, SEED_BOARD, medians)


class TestSeedFigures:
    def test_weights(self) -> None:
        """4 B params in 2.45 GB of weights are 4.9 bit, 0.6125 B, per weight."""
        assert SEED_META.bits_per_weight == pytest.approx(4.9)
        assert SEED_META.bytes_per_weight == pytest.approx(0.6125)

    def test_decode_gbs(self) -> None:
        """2.45 GB at 10.7 tok/s is 26 GB/s moved (26.2 exactly)."""
        assert decode_gbs(WEIGHTS, CHAT_DECODE_TOK_S) == pytest.approx(26.2, abs=0.05)
        assert round(decode_gbs(WEIGHTS, CHAT_DECODE_TOK_S) or 0) == 26

    def test_chat_ms_per_token(self) -> None:
        """The summary turns 10.7 tok/s into 93.5 ms per token and 26 GB/s moved."""
        chat = chat_summary()["kinds"]["chat"]
        assert chat["decode_ms_per_token"] == pytest.approx(93.5, abs=0.05)
        assert chat["decode_gbs"] == pytest.approx(26.2, abs=0.05)

    def test_floor(self) -> None:
        """The floor at 68 GB/s is 36 ms per token, which is 28 tok/s (27.8)."""
        assert floor_ms_per_token(WEIGHTS, 68.0) == pytest.approx(36.0, abs=0.05)
        summary = chat_summary()
        assert summary["floor_ms_per_token"] == pytest.approx(36.0, abs=0.05)
        assert summary["floor_tok_s"] == pytest.approx(27.8, abs=0.05)

    def test_roof_ratio(self) -> None:
        """93.5 ms per token over the 36 ms floor: the board runs at 2.6x the floor."""
        assert roof_ratio(93.5, floor_ms_per_token(WEIGHTS, 68.0)) == pytest.approx(2.6, abs=0.05)
        assert chat_summary()["kinds"]["chat"]["roof_ratio"] == pytest.approx(2.6, abs=0.05)

    def test_ridge(self) -> None:
        """fp32 peak 1.25 TFLOP/s over 68 GB/s is a ridge of 18 FLOP per byte (18.4)."""
        assert ridge(1.25, 68.0) == pytest.approx(18.4, abs=0.05)

    def test_prefill_intensity_seed_rounding(self) -> None:
        """100 tokens x 2 FLOP / 0.6 B per weight (2.4 GB for 4 B) is the published 333."""
        assert prefill_intensity(N_PARAMS, 100, 2_400_000_000) == pytest.approx(333.3, abs=0.05)

    def test_prefill_intensity_exact(self) -> None:
        """With the unrounded 0.6125 B per weight, 100 tokens give 327 FLOP per byte."""
        assert prefill_intensity(N_PARAMS, 100, WEIGHTS) == pytest.approx(326.5, abs=0.05)

    def test_decode_intensity(self) -> None:
        """One token: 2 FLOP / 0.6 B per weight = 3.3 FLOP per byte, far under the ridge."""
        assert decode_intensity(N_PARAMS, WEIGHTS) == pytest.approx(3.3, abs=0.05)
        assert decode_intensity(N_PARAMS, WEIGHTS) < (ridge(1.25, 68.0) or 0)

    def test_tool_call_traffic(self) -> None:
        """A tool call of 10 tokens reads 10 x 2.45 GB = 24.5 GB of DRAM."""
        assert traffic_per_tool_call(WEIGHTS, 10) == pytest.approx(24.5e9)

    def test_traffic_per_json_char(self) -> None:
        """24.5 GB for about forty characters of JSON is 0.61 GB per character."""
        assert traffic_per_json_char(WEIGHTS, 10, 40) == pytest.approx(0.6125e9)


class TestUnknowns:
    @pytest.mark.parametrize("rate", [None, 0.0, -1.0])
    def test_decode_gbs_unknown(self, rate: float | None) -> None:
        """An unknown or non-positive decode rate gives None, not 0."""
        assert decode_gbs(WEIGHTS, rate) is None

    @pytest.mark.parametrize("bandwidth", [None, 0.0])
    def test_floor_unknown(self, bandwidth: float | None) -> None:
        """Without a bandwidth there is no floor."""
        assert floor_ms_per_token(WEIGHTS, bandwidth) is None

    def test_ratio_and_ridge_unknown(self) -> None:
        """roof_ratio and ridge are None when an input is unknown."""
        assert roof_ratio(None, 36.0) is None
        assert roof_ratio(93.5, None) is None
        assert ridge(None, 68.0) is None
        assert ridge(1.25, None) is None

    def test_json_chars_unknown(self) -> None:
        """Traffic per JSON character is None when the length is unknown."""
        assert traffic_per_json_char(WEIGHTS, 10, None) is None
        assert traffic_per_json_char(WEIGHTS, 10, 0) is None


class TestModelMeta:
    def test_from_models_json(self) -> None:
        """size, n_params and the id are read from data[0] of /v1/models."""
        meta = ModelMeta.from_models_json(models_json(size=WEIGHTS, n_params=N_PARAMS))
        assert meta is not None
        assert (meta.size_bytes, meta.n_params, meta.name) == (WEIGHTS, N_PARAMS, "qwen3-4b.gguf")
        assert "/v1/models" in meta.source

    @pytest.mark.parametrize(
        "obj",
        [
            None,
            [],
            {},
            {"data": []},
            {"data": [{"id": "m"}]},
            models_json(size=WEIGHTS),
            models_json(n_params=N_PARAMS),
            models_json(size=0, n_params=N_PARAMS),
            models_json(size=True, n_params=N_PARAMS),
            models_json(size="2450000000", n_params=N_PARAMS),
        ],
    )
    def test_absent(self, obj: Any) -> None:
        """A response without a positive integer size and n_params gives None."""
        assert ModelMeta.from_models_json(obj) is None


class TestBoard:
    def test_preset_filled(self) -> None:
        """A preset alone gives the preset's bandwidth and peak (Orin Nano 8 GB: 68 GB/s)."""
        board = Board.from_config(BoardConfig(preset="jetson-orin-nano-8gb"))
        assert board.bandwidth_gbs == 68.0
        assert board.peak_tflops == BOARD_PRESETS["jetson-orin-nano-8gb"][1]
        assert board.name == "jetson-orin-nano-8gb"

    def test_explicit_wins(self) -> None:
        """Explicit values win over the preset's: a given peak replaces the preset's peaks,
        as one peak whose precision is the user's (not stated)."""
        board = Board.from_config(
            BoardConfig(preset="jetson-orin-nano-8gb", memory_bandwidth_gbs=60.0, peak_tflops=1.25)
        )
        assert (board.bandwidth_gbs, board.peak_tflops) == (60.0, 1.25)
        assert board.peaks == (Peak(1.25, GIVEN),)

    def test_zero_is_unknown(self) -> None:
        """0 in the config (the default) is unknown: None, and no peak."""
        board = Board.from_config(BoardConfig())
        assert (board.bandwidth_gbs, board.peak_tflops, board.known) == (None, None, False)
        assert board.peaks == ()

    def test_preset_peaks_name_their_precision(self) -> None:
        """The Orin Nano 8 GB preset has both peaks, each naming its precision: dense FP16 on
        the tensor cores, 10.24 TFLOP/s, and FP32 on the CUDA cores, 1.28 TFLOP/s (1024 cores
        x 2 FLOP x 625 MHz); the config's peak_tflops, filled by the preset, is the first."""
        assert [p.precision for p in ORIN.peaks] == [FP16_TENSOR, FP32_CUDA]
        assert [p.tflops for p in ORIN.peaks] == pytest.approx([10.24, 1.28])
        assert ORIN.peak_tflops == pytest.approx(10.24)

    def test_preset_loaded_through_the_config_keeps_its_peaks(self, tmp_path: Any) -> None:
        """A preset loaded by the config loader (which fills peak_tflops with the preset's
        highest peak) still gives both peaks with their precisions."""
        from proxy.config import load_config

        path = tmp_path / "config.toml"
        path.write_text('[board]\npreset = "jetson-orin-nano-8gb"\n')
        board = Board.from_config(load_config(path).board)
        assert [p.precision for p in board.peaks] == [FP16_TENSOR, FP32_CUDA]

    def test_every_jetson_has_both_peaks(self) -> None:
        """Every Jetson preset carries the FP16 tensor and FP32 CUDA-core peaks, the tensor
        one 8x the other; the AGX Orin 64 GB's FP32 peak is the technical brief's 5.3."""
        for name, spec in BOARD_SPECS.items():
            if not name.startswith("jetson"):
                continue
            fp16, fp32 = spec.peaks
            assert (fp16.precision, fp32.precision) == (FP16_TENSOR, FP32_CUDA), name
            assert fp16.tflops == pytest.approx(8 * fp32.tflops), name
        assert BOARD_SPECS["jetson-agx-orin-64gb"].peaks[1].tflops == pytest.approx(5.3, abs=0.05)

    def test_ridge_per_precision(self) -> None:
        """The Orin Nano's ridge is 151 FLOP per byte for FP16 tensor and 18.8 for FP32 CUDA
        cores (the measurement's 18 with its rounded 1.25): the summary gives both."""
        board = roofline_summary(None, ORIN, {})["board"]
        ridges = {p["precision"]: p["ridge_flop_per_byte"] for p in board["peaks"]}
        assert ridges == {
            FP16_TENSOR: pytest.approx(150.6, abs=0.05),
            FP32_CUDA: pytest.approx(18.8, abs=0.05),
        }

    def test_cpu_board_peak_unknown(self) -> None:
        """A preset without a peak figure (Raspberry Pi 5) keeps the peak unknown."""
        board = Board.from_config(BoardConfig(preset="raspberry-pi-5"))
        assert board.bandwidth_gbs == pytest.approx(17.068)
        assert board.peak_tflops is None


def rec(**fields: Any) -> Record:
    """A tool record with the given fields."""
    return Record(
        id="r", ts="t", method="POST", path="/v1/chat/completions", kind=Kind.TOOL, **fields
    )


class TestRecordRoofline:
    def test_seed(self) -> None:
        """A record decoding at 10.7 tok/s moved 26.2 GB/s and ran at 2.6x the 68 GB/s floor."""
        out = record_roofline(rec(decode_tok_s=10.7), SEED_META, SEED_BOARD)
        assert out.decode_gbs == pytest.approx(26.2, abs=0.05)
        assert out.roof_ratio == pytest.approx(2.6, abs=0.05)

    def test_no_board(self) -> None:
        """Without a board the GB/s is known but the ratio is not."""
        out = record_roofline(rec(decode_tok_s=10.7), SEED_META, None)
        assert out.decode_gbs is not None and out.roof_ratio is None

    def test_no_meta_or_rate(self) -> None:
        """Without the model size or the decode rate both fields are None."""
        none = RooflineFields(decode_gbs=None, roof_ratio=None)
        assert record_roofline(rec(decode_tok_s=10.7), None, SEED_BOARD) == none
        assert record_roofline(rec(decode_tok_s=None), SEED_META, SEED_BOARD) == none


SEED_MEDIANS = {
    "chat": Medians(decode_tok_s=10.7, prompt_n=20),
    "tool": Medians(decode_tok_s=6.0, prompt_n=100, tool_call_tokens=10, json_chars=40),
}


class TestSummaryAndLines:
    def test_summary_numbers(self) -> None:
        """The summary carries the measurement's figures as numbers, marked as estimates."""
        out = roofline_summary(SEED_META, SEED_BOARD, SEED_MEDIANS)
        assert out["estimate"] is True
        assert out["floor_ms_per_token"] == pytest.approx(36.0, abs=0.05)
        assert out["ridge_flop_per_byte"] == pytest.approx(18.4, abs=0.05)
        chat, tool = out["kinds"]["chat"], out["kinds"]["tool"]
        assert chat["decode_gbs"] == pytest.approx(26.2, abs=0.05)
        assert chat["roof_ratio"] == pytest.approx(2.6, abs=0.05)
        assert tool["tool_call_bytes"] == pytest.approx(24.5e9)
        assert tool["bytes_per_json_char"] == pytest.approx(0.6125e9)

    def test_summary_without_meta(self) -> None:
        """Without the model only the board's ridge is known."""
        out = roofline_summary(None, SEED_BOARD, SEED_MEDIANS)
        assert out["model"] is None and out["kinds"] == {}
        assert out["ridge_flop_per_byte"] == pytest.approx(18.4, abs=0.05)

    def test_lines_seed(self) -> None:
        """The lines give the measurement's figures: 2.45 GB, 26.2 GB/s, 36.0 ms, 2.6x, 24.5 GB;
        decode AI to three significant figures (3.27, published as 3.3)."""
        text = "\n".join(roofline_lines(SEED_META, SEED_BOARD, SEED_MEDIANS))
        for figure in (
            "2.45 GB",
            "1 / 10.7 tok/s = 93.5 ms",
            "26.2 GB/s",
            "36.0 ms per token",
            "27.8 tok/s",
            "2.6x the floor",
            "18.4 FLOP per byte",
            "3.27 FLOP per byte",
            "<< ridge 18.4 (FP32 CUDA cores): memory side",
            "24.5 GB of DRAM",
            "0.61 GB per character",
        ):
            assert figure in text, figure

    def test_lines_label_estimates(self) -> None:
        """Every line with a derived figure is labelled est., measured or spec, with one
        peak or two and with the prefill's achieved compute."""
        lines = roofline_lines(SEED_META, SEED_BOARD, SEED_MEDIANS)
        both = roofline_lines(SEED_META, ORIN, {**SEED_MEDIANS, "tool": TOOL_PREFILL})
        for line in [*lines, *both]:
            if "=" in line and not line.startswith("model"):
                assert any(tag in line for tag in ("(est.)", "measured", "(spec)")), line
        assert sum("(est.)" in line for line in lines) >= 6

    def test_lines_prefill_side(self) -> None:
        """The tool prompt's 100 tokens give 327 FLOP per byte, on the compute side."""
        text = "\n".join(roofline_lines(SEED_META, SEED_BOARD, SEED_MEDIANS))
        assert "100 tok x 2 FLOP / 0.61 B per weight = 327 FLOP per byte (est.)" in text
        assert ">> ridge 18.4 (FP32 CUDA cores): compute side" in text

    def test_lines_empty_without_meta(self) -> None:
        """No model size, no roofline lines."""
        assert roofline_lines(None, SEED_BOARD, SEED_MEDIANS) == []

    def test_lines_without_board(self) -> None:
        """Without a board the model-side lines remain and no floor is claimed."""
        text = "\n".join(roofline_lines(SEED_META, None, SEED_MEDIANS))
        assert "26.2 GB/s" in text
        assert "floor" not in text and "ridge" not in text

    def test_lines_ubatch_cap(self) -> None:
        """A prompt over 512 tokens notes that one pass evaluates at most --ubatch-size."""
        medians = {"tool": Medians(decode_tok_s=6.0, prompt_n=2000)}
        text = "\n".join(roofline_lines(SEED_META, SEED_BOARD, medians))
        assert "--ubatch-size" in text


# The measurement's median tool prefill: 796 ms for 128 prompt tokens of a 4 B model.
TOOL_PREFILL = Medians(decode_tok_s=6.0, prompt_n=128, prefill_ms=796.0, ttft_ms=820.0)
CHAT_TTFT = Medians(decode_tok_s=10.7, ttft_ms=162.0)


class TestPrefillCompute:
    """What the prefill achieved against each peak: the measurement's finding."""

    def test_flop_and_compute_time_per_token(self) -> None:
        """4 B params x 2 FLOP = 8 GFLOP per token: 6.4 ms at the measurement's FP32 peak of
        1.25 TFLOP/s, 6.25 at the preset's 1.28, 0.78 at the FP16 tensor peak."""
        assert flop_per_token(N_PARAMS) == 8e9
        assert compute_ms_per_token(N_PARAMS, 1.25) == pytest.approx(6.4)
        assert compute_ms_per_token(N_PARAMS, 1.28) == pytest.approx(6.25)
        assert compute_ms_per_token(N_PARAMS, 10.24) == pytest.approx(0.78125)
        assert compute_ms_per_token(N_PARAMS, None) is None

    def test_achieved(self) -> None:
        """2 x 4e9 x 128 / 0.796 s = 1.29 TFLOP/s: 13 % of the FP16 tensor peak, about all
        of the FP32 CUDA-core one."""
        tflops = achieved_tflops(N_PARAMS, 128, 796.0)
        assert tflops == pytest.approx(1.286, abs=0.001)
        assert peak_share(tflops, 10.24) == pytest.approx(0.126, abs=0.001)
        assert peak_share(tflops, 1.28) == pytest.approx(1.005, abs=0.001)

    @pytest.mark.parametrize(("tokens", "ms"), [(None, 796.0), (128, None), (0, 796.0), (128, 0)])
    def test_achieved_unknown(self, tokens: float | None, ms: float | None) -> None:
        """Without prompt tokens or a prefill time (or with 0) nothing was achieved: None."""
        assert achieved_tflops(N_PARAMS, tokens, ms) is None

    def test_summary_fields(self) -> None:
        """The summary's tool kind has the achieved TFLOP/s, the measured ms per prompt
        token (796 / 128 = 6.22), the share of each peak and the peak it reaches (FP32);
        the compute time per token at each peak is beside it."""
        out = roofline_summary(SEED_META, ORIN, {"tool": TOOL_PREFILL})
        tool = out["kinds"]["tool"]
        assert tool["prefill_tflops"] == pytest.approx(1.286, abs=0.001)
        assert tool["prefill_ms_per_token"] == pytest.approx(6.219, abs=0.001)
        assert tool["prefill_shares"] == {
            FP16_TENSOR: pytest.approx(0.1256, abs=0.0001),
            FP32_CUDA: pytest.approx(1.005, abs=0.0001),
        }
        assert tool["prefill_reaches"] == FP32_CUDA
        assert out["compute_ms_per_token"] == {FP16_TENSOR: 0.7812, FP32_CUDA: 6.25}

    def test_lines_say_the_kernels_miss_the_tensor_cores(self) -> None:
        """The lines give the achieved compute with its shares and say that the prefill runs
        at about the FP32 peak, so its kernels do not reach the tensor cores."""
        text = "\n".join(roofline_lines(SEED_META, ORIN, {"tool": TOOL_PREFILL}))
        assert "tool: 2 x 4.00 B x 128 tok / 796 ms = 1.29 TFLOP/s achieved" in text
        assert "13 % of FP16 tensor, 100 % of FP32 CUDA cores" in text
        assert "796 / 128 = 6.22 ms per prompt token (measured)" in text
        assert "its kernels do not reach the tensor cores" in text
        assert "0.78 ms at FP16 tensor, 6.25 ms at FP32 CUDA cores (spec)" in text

    def test_silent_when_the_prefill_reaches_the_tensor_peak(self) -> None:
        """A prefill at 60 % of the FP16 tensor peak (128 tokens in 167 ms) is not said to
        miss the tensor cores."""
        fast = Medians(prompt_n=128, prefill_ms=167.0)
        lines = roofline_lines(SEED_META, ORIN, {"tool": fast})
        text = "\n".join(lines)
        assert "TFLOP/s achieved" in text
        assert "tensor cores" not in text and "about the" not in text

    def test_silent_with_one_peak(self) -> None:
        """With the measurement's one FP32 peak there is nothing above it to miss: the shares
        are given, no verdict."""
        text = "\n".join(roofline_lines(SEED_META, SEED_BOARD, {"tool": TOOL_PREFILL}))
        assert "103 % of FP32 CUDA cores" in text
        assert "about the" not in text

    def test_unknown_without_prompt_tokens(self) -> None:
        """A prefill time without the prompt tokens evaluated says the compute is unknown."""
        medians = {"tool": Medians(prefill_ms=820.0, ttft_ms=820.0)}
        text = "\n".join(roofline_lines(SEED_META, ORIN, medians))
        assert "compute achieved: unknown" in text and "prompt_n" in text


class TestToolsPrefill:
    """The measurement's cross-check: tool TTFT - chat TTFT = the tools' prefill per call."""

    def test_difference(self) -> None:
        """820 - 162 = 658 ms, 4.1x the chat TTFT."""
        check = tools_prefill({"tool": TOOL_PREFILL, "chat": CHAT_TTFT})
        assert check is not None
        assert (check["extra_ms"], check["times_chat"]) == (658.0, 4.06)

    def test_tokens_at_the_measured_ms_per_token(self) -> None:
        """With the tool prompt's tokens known, 658 ms at 796 / 128 = 6.22 ms per token is
        about 106 tokens, and that basis is the only one."""
        check = tools_prefill({"tool": TOOL_PREFILL, "chat": CHAT_TTFT}, SEED_META, ORIN)
        assert check is not None
        (tokens,) = check["tokens"]
        assert tokens["basis"] == "measured"
        assert tokens["tokens"] == pytest.approx(105.8, abs=0.05)

    def test_tokens_at_each_peak(self) -> None:
        """Without prompt tokens, the measurement's arithmetic: 658 / 6.4 = about 103 tokens
        at its FP32 peak; the preset gives one figure per peak."""
        tool = Medians(ttft_ms=820.0)
        check = tools_prefill({"tool": tool, "chat": CHAT_TTFT}, SEED_META, SEED_BOARD)
        assert check is not None
        assert [round(t["tokens"]) for t in check["tokens"]] == [103]
        assert implied_tokens(658.0, 6.4) == pytest.approx(102.8, abs=0.05)
        both = tools_prefill({"tool": tool, "chat": CHAT_TTFT}, SEED_META, ORIN)
        assert both is not None
        assert {t["basis"]: round(t["tokens"]) for t in both["tokens"]} == {
            FP16_TENSOR: 842,
            FP32_CUDA: 105,
        }

    def test_line(self) -> None:
        """The cross-check line reads as the measurement's, with the tokens below it."""
        check = tools_prefill({"tool": TOOL_PREFILL, "chat": CHAT_TTFT}, SEED_META, ORIN)
        lines = tools_prefill_lines(check)
        assert lines[0].startswith(
            "cross-check: tool TTFT - chat TTFT = 658 ms of prefill per call for the tools"
        )
        assert "about 106 tokens at the measured 6.22 ms per prompt token" in "\n".join(lines)

    def test_silent_without_both_kinds(self) -> None:
        """Without chat (or tool) TTFTs there is no cross-check and no line."""
        assert tools_prefill({"tool": TOOL_PREFILL}) is None
        assert tools_prefill({"tool": TOOL_PREFILL, "chat": Medians(decode_tok_s=10.7)}) is None
        assert tools_prefill_lines(None) == []

    def test_no_tokens_when_tools_cost_nothing(self) -> None:
        """When tool calls start no later than chat (the tools cached), no tokens are
        implied and the line says so."""
        check = tools_prefill({"tool": Medians(ttft_ms=150.0), "chat": CHAT_TTFT}, SEED_META, ORIN)
        assert check is not None and check["tokens"] == []
        (line,) = tools_prefill_lines(check)
        assert "-12 ms" in line and "no later than chat" in line
