"""Board data: memory bandwidth and peak compute, by precision, of the boards robots run on.

Pure. ``[board] preset`` in ``config.toml`` names one of :data:`BOARD_SPECS`; explicit
figures override it. :class:`Board` is what the roofline takes: the bandwidth and every
peak with the precision it counts, since a ridge (FLOP per byte) is only meaningful for the
precision the kernels actually run at.

The Jetson Orin figures, and where they come from:

* bandwidth: NVIDIA's module data sheets (Jetson Orin Nano series, Orin NX series, AGX Orin
  series: 128-bit LPDDR5 at 68 / 102.4 GB/s, 256-bit at 204.8 GB/s; the Orin Nano 4 GB is
  64-bit, 34 GB/s);
* ``FP32 CUDA cores``: CUDA cores x 2 FLOP (one FMA) x the maximum GPU clock, both from the
  same data sheets. NVIDIA's Jetson AGX Orin Series Technical Brief (v1.2) states the result
  for the AGX Orin 64 GB: 2048 CUDA cores at 1.3 GHz, "5.3 FP32 TFLOPs";
* ``FP16 tensor``: the dense FP16 tensor-core peak, 1024 FMA = 2048 FLOP per clock per SM
  (Ampere's third-generation tensor cores, four per SM). The data sheets give "sparse INT8
  TOPS" instead (40 for the Orin Nano 8 GB, 170 for the AGX Orin 64 GB); a quarter of that
  (sparse to dense: /2, INT8 to FP16: /2) agrees with the figure here (10 and 42.5).

The tensor-core peak is 8x the CUDA-core one on these GPUs; kernels that do not use the
tensor cores (llama.cpp's CUDA path on quantized weights may not, depending on the build and
the batch) are bounded by the lower one. The CPU-only boards have no vendor FLOP figure
(llama.cpp does not use their GPU or NPU), so their peaks are unknown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "BOARD_PRESETS",
    "BOARD_SPECS",
    "FP16_TENSOR",
    "FP32_CUDA",
    "GIVEN",
    "Board",
    "BoardSettings",
    "BoardSpec",
    "Peak",
]

FP16_TENSOR = "FP16 tensor"
"""Dense FP16 on the tensor cores (no structured sparsity)."""
FP32_CUDA = "FP32 CUDA cores"
"""FP32 fused multiply-adds on the CUDA cores."""
GIVEN = "precision not given"
"""A peak the user gave (``--peak-tflops``, ``[board] peak_tflops``): its precision is theirs."""


@dataclass(frozen=True, slots=True)
class Peak:
    """A peak compute rate and the precision it counts."""

    tflops: float
    precision: str


@dataclass(frozen=True, slots=True)
class BoardSpec:
    """A preset: the memory bandwidth and the peaks, highest first (none: unknown)."""

    bandwidth_gbs: float
    peaks: tuple[Peak, ...] = ()


def _orin(sms: int, gpu_mhz: float) -> tuple[Peak, ...]:
    """An Orin (Ampere) GPU's peaks: 128 CUDA cores and four tensor cores per SM."""
    return (
        Peak(sms * 2048 * gpu_mhz / 1e6, FP16_TENSOR),
        Peak(sms * 128 * 2 * gpu_mhz / 1e6, FP32_CUDA),
    )


BOARD_SPECS: dict[str, BoardSpec] = {
    # 68 GB/s (128-bit LPDDR5); 1024 CUDA cores = 8 SM at 625 MHz (40 sparse INT8 TOPS):
    # 10.24 TFLOP/s FP16 tensor, 1.28 TFLOP/s FP32
    "jetson-orin-nano-8gb": BoardSpec(68.0, _orin(8, 625)),
    # 34 GB/s (64-bit LPDDR5); 512 CUDA cores = 4 SM at 625 MHz (20 sparse INT8 TOPS)
    "jetson-orin-nano-4gb": BoardSpec(34.0, _orin(4, 625)),
    # 102.4 GB/s (128-bit LPDDR5); 1024 CUDA cores = 8 SM at 918 MHz (GPU 60 sparse INT8 TOPS)
    "jetson-orin-nx-16gb": BoardSpec(102.4, _orin(8, 918)),
    # 102.4 GB/s (128-bit LPDDR5); 1024 CUDA cores = 8 SM at 765 MHz (GPU 50 sparse INT8 TOPS)
    "jetson-orin-nx-8gb": BoardSpec(102.4, _orin(8, 765)),
    # 204.8 GB/s (256-bit LPDDR5); 2048 CUDA cores = 16 SM at 1300 MHz (GPU 170 sparse INT8
    # TOPS; the technical brief's "5.3 FP32 TFLOPs")
    "jetson-agx-orin-64gb": BoardSpec(204.8, _orin(16, 1300)),
    # 204.8 GB/s (256-bit LPDDR5); 1792 CUDA cores = 14 SM at 930 MHz
    "jetson-agx-orin-32gb": BoardSpec(204.8, _orin(14, 930)),
    # vendor spec memory: LPDDR4X-4267 on a 32-bit bus -> 4267 MT/s x 4 B = 17.07 GB/s
    "raspberry-pi-5": BoardSpec(4267 * 4 / 1000),
    # vendor spec memory: LPDDR4X up to 2112 MHz (4224 MT/s) x 64-bit -> 33.8 GB/s theoretical
    "rk3588": BoardSpec(4224 * 8 / 1000),
}
"""Every preset's bandwidth and peaks by precision (the sources: the module docstring)."""

BOARD_PRESETS: dict[str, tuple[float, float]] = {
    name: (spec.bandwidth_gbs, spec.peaks[0].tflops if spec.peaks else 0.0)
    for name, spec in BOARD_SPECS.items()
}
"""name -> (memory bandwidth GB/s, the highest peak in TFLOP/s, 0.0 = unknown): what the
``[board]`` section's two numbers are filled with (``memory_bandwidth_gbs``,
``peak_tflops``; for the Jetsons the dense FP16 tensor-core peak)."""


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


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
    """The board's figures: bandwidth (``None`` = unknown) and its peaks, highest first."""

    bandwidth_gbs: float | None
    peaks: tuple[Peak, ...] = ()
    name: str | None = None

    @classmethod
    def from_config(cls, config: BoardSettings) -> Board:
        """The ``[board]`` section as a Board: 0 means unknown; a preset fills what is 0.

        A preset's peaks come with their precisions; a ``peak_tflops`` other than the
        preset's own (the config loader fills it with the preset's highest) is the user's,
        and replaces them as one peak of :data:`GIVEN` precision.
        """
        spec = BOARD_SPECS.get(config.preset) if config.preset is not None else None
        bandwidth = config.memory_bandwidth_gbs or (spec.bandwidth_gbs if spec else 0.0)
        tflops = config.peak_tflops
        if spec is not None and tflops in (0.0, BOARD_PRESETS[config.preset or ""][1]):
            peaks = spec.peaks
        else:
            peaks = (Peak(tflops, GIVEN),) if tflops > 0 else ()
        return cls(_positive(bandwidth), peaks, config.preset)

    @property
    def peak_tflops(self) -> float | None:
        """The highest peak, ``None`` when none is known."""
        return max((p.tflops for p in self.peaks), default=None)

    @property
    def known(self) -> bool:
        """Whether at least the bandwidth is known (the floor needs it)."""
        return self.bandwidth_gbs is not None
