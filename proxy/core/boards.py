"""Board data: memory bandwidth and peak FP16 compute of the boards robots run on. Pure.

``[board] preset`` in ``config.toml`` names one of these; explicit figures override it.
"""

from __future__ import annotations

__all__ = ["BOARD_PRESETS"]


def _orin_fp16_tflops(sms: int, gpu_mhz: float) -> float:
    """Dense FP16 tensor-core peak of an Orin (Ampere) GPU: 1024 FMA = 2048 FLOP/clock/SM."""
    return sms * 2048 * gpu_mhz / 1e6


# name -> (memory bandwidth GB/s, peak dense FP16 TFLOP/s; 0.0 = unknown).
# The Jetson bandwidths are NVIDIA's module spec figures. The Jetson peaks are derived from the
# vendor spec (SM count x max GPU clock); they equal 1/4 of NVIDIA's "sparse INT8 TOPS" GPU
# figure (e.g. AGX Orin 64GB: 170 TOPS / 4 = 42.6). The CPU-only boards have no vendor FP16
# figure (llama.cpp does not use their GPU/NPU), so their peak is 0.0 = unknown.
BOARD_PRESETS: dict[str, tuple[float, float]] = {
    # vendor spec: 68 GB/s (128-bit LPDDR5); GPU 8 SM @ 625 MHz (40 sparse INT8 TOPS)
    "jetson-orin-nano-8gb": (68.0, _orin_fp16_tflops(8, 625)),
    # vendor spec: 34 GB/s (64-bit LPDDR5); GPU 4 SM @ 625 MHz (20 sparse INT8 TOPS)
    "jetson-orin-nano-4gb": (34.0, _orin_fp16_tflops(4, 625)),
    # vendor spec: 102.4 GB/s (128-bit LPDDR5); GPU 8 SM @ 918 MHz (60 sparse INT8 TOPS)
    "jetson-orin-nx-16gb": (102.4, _orin_fp16_tflops(8, 918)),
    # vendor spec: 102.4 GB/s (128-bit LPDDR5); GPU 8 SM @ 765 MHz (50 sparse INT8 TOPS)
    "jetson-orin-nx-8gb": (102.4, _orin_fp16_tflops(8, 765)),
    # vendor spec: 204.8 GB/s (256-bit LPDDR5); GPU 16 SM @ 1300 MHz (170 sparse INT8 TOPS)
    "jetson-agx-orin-64gb": (204.8, _orin_fp16_tflops(16, 1300)),
    # vendor spec: 204.8 GB/s (256-bit LPDDR5); GPU 14 SM @ 930 MHz
    "jetson-agx-orin-32gb": (204.8, _orin_fp16_tflops(14, 930)),
    # vendor spec memory: LPDDR4X-4267 on a 32-bit bus -> 4267 MT/s x 4 B = 17.07 GB/s
    "raspberry-pi-5": (4267 * 4 / 1000, 0.0),
    # vendor spec memory: LPDDR4X up to 2112 MHz (4224 MT/s) x 64-bit -> 33.8 GB/s theoretical
    "rk3588": (4224 * 8 / 1000, 0.0),
}
