"""tegrastats lines, and what the board did during one request: pure, no I/O.

``parse_line`` reads one line of NVIDIA's ``tegrastats`` (Jetson Nano, Xavier NX/AGX, Orin
Nano/NX/AGX; JetPack 4 to 6, and the three-value rails and temperatures of JetPack 7), with
or without the leading ``MM-DD-YYYY HH:MM:SS`` stamp that newer JetPacks print, into a frozen
``TegraSample``. The regular expressions follow jetson-stats' ``jtop/core/tegra_parse.py``.

**The board's input power** (``TegraSample.input_mw``): the rail that measures the whole
module when the board has one, else the sum of the rails it prints:

- ``VDD_IN``: Orin Nano and Orin NX (rails ``VDD_IN``, ``VDD_CPU_GPU_CV``, ``VDD_SOC``),
  Xavier NX, TX2;
- ``POM_5V_IN``: the original Jetson Nano;
- ``VIN``: named as the total input on Jetson Thor (unverified here: no Thor line was found);
- otherwise the **sum** of every rail but ``NC`` (not connected): AGX Orin (``VDD_GPU_SOC`` +
  ``VDD_CPU_CV`` + ``VIN_SYS_5V0`` + ``VDDQ_VDD2_1V8AO``) and AGX Xavier (``GPU``, ``CPU``,
  ``SOC``, ``CV``, ``VDDRQ``, ``SYS5V``). ``input_rail`` is then ``"sum"``. jtop does the same.
  ``VIN_SYS_5V0`` alone is *not* the AGX Orin's input: it is the 5 V system rail beside the
  GPU/SoC and CPU/CV rails. The carrier board is outside every one of these rails.

Each rail prints ``current/average`` (JetPack 7: ``current/average/max``); the average runs
over tegrastats' whole life, so only the current value is used.

**Over a request** (``board_fields``): the samples are stamped with the proxy's clock on
arrival and joined by straight lines; a value at ``t0`` or ``t1`` is interpolated between the
samples around it, never extrapolated. The interval ``[t0, t1]`` is **covered** when some
sample is at or before ``t0`` and some sample is at or after ``t1``; otherwise every field is
None. Energy is the integral of the input power over the interval (trapezoids between
samples, the interpolated values at the ends): milliwatts times seconds are millijoules.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from proxy.core.partials import BoardFields

__all__ = [
    "TOTAL_RAILS",
    "Rail",
    "TegraSample",
    "board_fields",
    "bracket",
    "input_power",
    "integral",
    "parse_line",
    "value_at",
]

TOTAL_RAILS = ("VDD_IN", "POM_5V_IN", "VIN")
"""Rails that measure the whole module, in order of preference."""

_NOT_RAILS = frozenset({"RAM", "SWAP", "IRAM", "NC"})
_NOT_TEMPERATURES = frozenset({"PMIC"})  # a fixed placeholder (100C or 50C), not a reading
_NO_SENSOR_C = -200.0  # "CV0@-256C": the zone exists, its sensor does not

_DATE_RE = re.compile(r"^\s*(\d{2}-\d{2}-\d{4} \d{2}:\d{2}:\d{2})\s+")
_RAM_RE = re.compile(r"\bRAM (\d+)/(\d+)([kMG])B")
_SWAP_RE = re.compile(r"\bSWAP (\d+)/(\d+)([kMG])B")
_CPU_RE = re.compile(r"\bCPU \[([^\]]*)\](?:@(\d+))?", re.IGNORECASE)
_CORE_RE = re.compile(r"^(\d+)%(?:@(\d+))?$")
_GR3D_RE = re.compile(r"\bGR3D(?:_FREQ)? (?:(\d+)%)?(?:@\[?(\d+))?")
_EMC_RE = re.compile(r"\bEMC(?:_FREQ)? (\d+)%(?:@(\d+))?")
_TEMP_RE = re.compile(r"\b([A-Za-z][\w-]*)@(-?\d+(?:\.\d+)?)C\b")
_NUM = r"(\d+(?:\.\d+)?)(mW|W)?"
_RAIL_RE = re.compile(rf"\b([A-Z][A-Z0-9_]*) {_NUM}/{_NUM}(?:/{_NUM})?\b")
_TO_MB = {"k": 1 / 1024, "M": 1.0, "G": 1024.0}


@dataclass(frozen=True, slots=True)
class Rail:
    """One power rail: ``NAME current/average`` in milliwatts."""

    current_mw: float
    average_mw: float


@dataclass(frozen=True, slots=True)
class TegraSample:
    """What one tegrastats line says; None (or empty) for what it does not print."""

    stamp: str | None = None  # the line's own date-time, as printed (JetPack 5.1+)
    ram_used_mb: float | None = None
    ram_total_mb: float | None = None
    swap_used_mb: float | None = None
    swap_total_mb: float | None = None
    cpu_loads_pct: tuple[float | None, ...] = ()  # None: the core is off
    cpu_freqs_mhz: tuple[int | None, ...] = ()
    gpu_busy_pct: float | None = None  # GR3D_FREQ
    gpu_freq_mhz: int | None = None  # the first GPC's when several are printed
    emc_pct: float | None = None
    emc_freq_mhz: int | None = None
    temps_c: Mapping[str, float] = field(default_factory=dict)
    rails: Mapping[str, Rail] = field(default_factory=dict)
    input_rail: str | None = None  # a TOTAL_RAILS name, "sum", or None without rails
    input_mw: float | None = None

    @property
    def temp_max_c(self) -> float | None:
        """The hottest real sensor (PMIC's fixed placeholder left out)."""
        temps = [c for name, c in self.temps_c.items() if name.upper() not in _NOT_TEMPERATURES]
        return max(temps) if temps else None


def _mb(value: str, unit: str) -> float:
    return int(value) * _TO_MB[unit]


def _cpus(match: re.Match[str] | None) -> tuple[tuple[float | None, ...], tuple[int | None, ...]]:
    """Per-core loads and frequencies from ``CPU [..]`` (``N%@F``, ``N%`` with ``]@F``, off)."""
    if match is None:
        return (), ()
    shared = int(match.group(2)) if match.group(2) else None
    loads: list[float | None] = []
    freqs: list[int | None] = []
    for core in match.group(1).split(","):
        m = _CORE_RE.match(core.strip())
        loads.append(float(m.group(1)) if m else None)
        freqs.append(int(m.group(2)) if m and m.group(2) else (shared if m else None))
    return tuple(loads), tuple(freqs)


def _milliwatts(value: str, unit: str | None) -> float:
    return float(value) * (1000.0 if unit == "W" else 1.0)


def _rails(text: str) -> dict[str, Rail]:
    rails: dict[str, Rail] = {}
    for m in _RAIL_RE.finditer(text):
        name = m.group(1)
        if name in _NOT_RAILS:
            continue
        rails[name] = Rail(_milliwatts(m.group(2), m.group(3)), _milliwatts(m.group(4), m.group(5)))
    return rails


def _temps(text: str) -> dict[str, float]:
    temps: dict[str, float] = {}
    for name, value in _TEMP_RE.findall(text):
        celsius = float(value)
        if celsius > _NO_SENSOR_C:
            temps[name] = celsius
    return temps


def input_power(rails: Mapping[str, Rail]) -> tuple[str | None, float | None]:
    """(which rail, its current mW): a total rail if printed, else ``"sum"`` of the others."""
    for name in TOTAL_RAILS:
        if name in rails:
            return name, rails[name].current_mw
    if not rails:
        return None, None
    return "sum", sum(rail.current_mw for rail in rails.values())


def _pair(match: re.Match[str] | None) -> tuple[float | None, int | None]:
    if match is None:
        return None, None
    pct, freq = match.group(1), match.group(2)
    return (float(pct) if pct else None), (int(freq) if freq else None)


def parse_line(line: str) -> TegraSample | None:
    """One tegrastats line as a sample; None when it holds neither RAM nor a power rail."""
    date = _DATE_RE.match(line)
    text = line[date.end() :] if date else line
    ram = _RAM_RE.search(text)
    rails = _rails(text)
    if ram is None and not rails:
        return None
    swap = _SWAP_RE.search(text)
    loads, freqs = _cpus(_CPU_RE.search(text))
    gpu_pct, gpu_freq = _pair(_GR3D_RE.search(text))
    emc_pct, emc_freq = _pair(_EMC_RE.search(text))
    input_rail, input_mw = input_power(rails)
    return TegraSample(
        stamp=date.group(1) if date else None,
        ram_used_mb=_mb(ram.group(1), ram.group(3)) if ram else None,
        ram_total_mb=_mb(ram.group(2), ram.group(3)) if ram else None,
        swap_used_mb=_mb(swap.group(1), swap.group(3)) if swap else None,
        swap_total_mb=_mb(swap.group(2), swap.group(3)) if swap else None,
        cpu_loads_pct=loads,
        cpu_freqs_mhz=freqs,
        gpu_busy_pct=gpu_pct,
        gpu_freq_mhz=gpu_freq,
        emc_pct=emc_pct,
        emc_freq_mhz=emc_freq,
        temps_c=_temps(text),
        rails=rails,
        input_rail=input_rail,
        input_mw=input_mw,
    )


# --- interval arithmetic on (time, value) points sorted by time ----------------------------


def bracket(times: Sequence[float], t0: float, t1: float) -> tuple[int, int] | None:
    """Indices (i, j) of the last point at or before ``t0`` and the first at or after ``t1``;
    None when the points do not cover ``[t0, t1]`` (or ``t1 < t0``)."""
    if t1 < t0:
        return None
    i = bisect.bisect_right(times, t0) - 1
    j = bisect.bisect_left(times, t1)
    if i < 0 or j >= len(times):
        return None
    return i, j


def _lerp(t: float, ta: float, va: float, tb: float, vb: float) -> float:
    return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)


def value_at(points: Sequence[tuple[float, float]], t: float) -> float | None:
    """The piecewise-linear value at ``t``; None outside the points (no extrapolation)."""
    times = [p[0] for p in points]
    span = bracket(times, t, t)
    if span is None:
        return None
    i, j = span
    return _lerp(t, *points[i], *points[j])


def integral(points: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """The integral of the piecewise-linear function over ``[t0, t1]`` (trapezoids, the ends
    interpolated); None when the points do not cover the interval."""
    times = [p[0] for p in points]
    span = bracket(times, t0, t1)
    if span is None:
        return None
    i, j = span
    inner = [p for p in points[i + 1 : j] if t0 < p[0] < t1]
    knots = [(t0, _lerp(t0, *points[i], *points[i + 1 if i < j else i]))]
    knots += inner
    knots.append((t1, _lerp(t1, *points[j - 1 if j > i else j], *points[j])))
    return sum((tb - ta) * (va + vb) / 2.0 for (ta, va), (tb, vb) in pairwise(knots))


def _series(
    samples: Sequence[tuple[float, TegraSample]], get: Callable[[TegraSample], float | None]
) -> list[tuple[float, float]]:
    points: list[tuple[float, float]] = []
    for t, sample in samples:
        value = get(sample)
        if value is not None:
            points.append((t, value))
    return points


def _mean(points: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """Time-weighted mean over ``[t0, t1]``; the value at ``t0`` when the interval is empty."""
    if t1 == t0:
        return value_at(points, t0)
    area = integral(points, t0, t1)
    return None if area is None else area / (t1 - t0)


def _peak(points: Sequence[tuple[float, float]], t0: float, t1: float) -> float | None:
    """The largest sample from the one at or before ``t0`` to the one at or after ``t1``."""
    span = bracket([p[0] for p in points], t0, t1)
    if span is None:
        return None
    i, j = span
    return max(p[1] for p in points[i : j + 1])


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def board_fields(
    samples: Sequence[tuple[float, TegraSample]], t0: float, t1: float, tokens: int | None
) -> BoardFields:
    """The record's board fields for a request over ``[t0, t1]`` (seconds, the samples' clock).

    ``energy_mj`` (input power integrated, mW x s), ``energy_mj_per_token`` (over ``tokens``,
    the decoded tokens; None for 0 or unknown), ``power_w_avg`` (energy over the duration),
    ``gpu_busy_pct`` (time-weighted mean of GR3D_FREQ), ``ram_used_mb`` and ``temp_max_c``
    (the largest sample from the one at or before ``t0`` to the one at or after ``t1``).
    Each is None when its samples do not cover the interval.
    """
    power = _series(samples, lambda s: s.input_mw)
    energy = integral(power, t0, t1)
    mean_mw = _mean(power, t0, t1)
    return BoardFields(
        energy_mj=_round(energy),
        energy_mj_per_token=_round(energy / tokens) if energy is not None and tokens else None,
        power_w_avg=_round(None if mean_mw is None else mean_mw / 1000.0, 6),
        gpu_busy_pct=_round(_mean(_series(samples, lambda s: s.gpu_busy_pct), t0, t1)),
        ram_used_mb=_round(_peak(_series(samples, lambda s: s.ram_used_mb), t0, t1)),
        temp_max_c=_round(_peak(_series(samples, lambda s: s.temp_max_c), t0, t1)),
    )
