"""The tegrastats parser on real lines of each Jetson family, and the interval arithmetic.

The lines are as boards printed them (collected from public logs, tests and docs; the source
of each is named). Expected values are read off the line text itself.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from proxy.core.partials import fields_of
from proxy.core.tegrastats import (
    Rail,
    TegraSample,
    board_fields,
    bracket,
    input_power,
    integral,
    parse_line,
    value_at,
)

# Orin Nano, JetPack 6 (date-time stamp first; lower-case thermal zones; rails in mW).
ORIN_NANO = (
    "05-05-2025 06:05:39 RAM 2639/7620MB (lfb 9x4MB) SWAP 0/3810MB (cached 0MB) "
    "CPU [1%@729,4%@729,8%@729,4%@729,5%@729,4%@729] GR3D_FREQ 0% cpu@44.156C soc2@43.781C "
    "soc0@44.687C gpu@45.968C tj@45.968C soc1@45.312C "
    "VDD_IN 5263mW/5263mW VDD_CPU_GPU_CV 717mW/717mW VDD_SOC 1794mW/1794mW"
)
# Orin NX/Nano module (p3767: the same three rails), JetPack 5: upper-case zones, DLA (CV)
# zones, two cores off, a second GR3D engine.
ORIN_NX = (
    "01-24-2024 09:17:09 RAM 3503/7337MB (lfb 7x1MB) SWAP 430/3668MB (cached 1MB) "
    "CPU [11%@729,13%@729,9%@729,18%@729,off,off] EMC_FREQ 0%@2133 GR3D_FREQ 0%@305 "
    "GR3D2_FREQ 0%@0 VIC_FREQ 115 APE 174 CV0@42.718C CPU@44.093C SOC2@42.625C SOC0@43.281C "
    "CV1@42.25C GPU@41.343C tj@46.968C SOC1@46.968C CV2@42.875C "
    "VDD_IN 4915mW/4915mW VDD_CPU_GPU_CV 449mW/449mW VDD_SOC 1431mW/1431mW"
)
# AGX Orin 64 GB, JetPack 6: no total rail; 12 cores; two GPCs; a DLA running.
AGX_ORIN = (
    "11-21-2025 08:49:48 RAM 13983/62780MB (lfb 424x4MB) SWAP 126/31390MB (cached 0MB) "
    "CPU [90%@2201,100%@2201,100%@2201,100%@2201,100%@2201,100%@2201,100%@2201,100%@2201,"
    "100%@2201,100%@2201,100%@2201,100%@2201] EMC_FREQ 1%@2133 GR3D_FREQ 14%@[407,407] "
    "VIC_FREQ 115 NVDLA0_FREQ @1600 APE 174 CV0@73.625C CPU@77.281C Tboard@62C SOC2@70C "
    "Tdiode@62.25C SOC0@69.531C CV1@72.5C GPU@69.125C tj@77.281C SOC1@68.968C CV2@67.25C "
    "VDD_GPU_SOC 3150mW/2971mW VDD_CPU_CV 14312mW/12415mW VIN_SYS_5V0 4968mW/5048mW "
    "VDDQ_VDD2_1V8AO 1091mW/1091mW"
)
# AGX Orin, JetPack 7 form: current/average/max rails and current/max temperatures.
AGX_ORIN_JP7 = (
    "07-25-2026 09:08:28 RAM 20642/62817MB (lfb 1x2MB) "
    "CPU [23%@2201,10%@2201,4%@2201,14%@2201,30%@2201,18%@2201,10%@2201,10%@2201,33%@2201,"
    "7%@2201,5%@2201,27%@2201] EMC_FREQ 3%@3199 GR3D_FREQ 12%@[1300,1300] NVENC0 off "
    "NVDEC0 off NVJPG0 off NVJPG1 off VIC off OFA off NVDLA0 off NVDLA1 off PVA0_FREQ off "
    "APE 174 cpu@52.968C/52.968C soc2@48.406C/48.406C soc0@49.531C/49.531C "
    "gpu@47.625C/47.625C VDD_GPU_SOC 5139mW/5139mW/5139mW VDD_CPU_CV 3268mW/3268mW/3268mW "
    "VIN_SYS_5V0 5500mW/5500mW/5500mW"
)
# Xavier NX, JetPack 5 (no stamp): VDD_IN in mW; PMIC@50C is a fixed placeholder.
XAVIER_NX = (
    "RAM 2690/6854MB (lfb 6x1MB) SWAP 479/3427MB (cached 3MB) "
    "CPU [3%@1904,7%@1906,1%@1905,0%@1907,off,off] EMC_FREQ 0%@1600 GR3D_FREQ 0%@[510] "
    "VIC_FREQ 601 APE 150 AUX@39C CPU@39.5C AO@37.5C GPU@37.5C PMIC@50C "
    "VDD_IN 5079mW/5079mW VDD_CPU_GPU_CV 696mW/696mW VDD_SOC 1104mW/1104mW"
)
# AGX Xavier, JetPack 4: six rails without units and no total rail; PMIC@100C placeholder.
AGX_XAVIER = (
    "RAM 1903/15692MB (lfb 3251x4MB) "
    "CPU [1%@1190,1%@1190,2%@1190,0%@1190,0%@1190,0%@1190,0%@1190,0%@1190] EMC_FREQ 0% "
    "GR3D_FREQ 0% AO@32.5C GPU@32C Tboard@32C Tdiode@34.75C AUX@31.5C CPU@33.5C thermal@32.9C "
    "PMIC@100C GPU 0/0 CPU 216/216 SOC 864/864 CV 0/0 VDDRQ 144/144 SYS5V 1889/1889"
)
# Jetson Nano, JetPack 4 (jetson-stats' emulator line): POM_5V_IN, IRAM.
NANO = (
    "RAM 1180/3965MB (lfb 1x2MB) SWAP 149/1024MB (cached 7MB) IRAM 0/252kB(lfb 252kB) "
    "CPU [30%@1036,33%@1036,28%@1036,26%@1036] EMC_FREQ 10%@1600 GR3D_FREQ 0%@76 NVENC 716 "
    "NVDEC 716 APE 25 PLL@57C CPU@60.5C PMIC@100C GPU@59C AO@65C thermal@59.75C "
    "POM_5V_IN 4520/4680 POM_5V_GPU 0/0 POM_5V_CPU 1078/1205"
)
# Jetson TX1, L4T 28: one frequency for all cores after the bracket, no rails.
TX1 = (
    "RAM 3468/3983MB (lfb 48x4MB) SWAP 873/8192MB (cached 295MB) "
    "cpu [17%,13%,29%,5%]@408 EMC 1%@408 APE 25 GR3D 3%@76"
)
ALL_LINES = [ORIN_NANO, ORIN_NX, AGX_ORIN, AGX_ORIN_JP7, XAVIER_NX, AGX_XAVIER, NANO, TX1]


def parsed(line: str) -> TegraSample:
    sample = parse_line(line)
    assert sample is not None
    return sample


class TestParseFamilies:
    def test_orin_nano_jetpack6(self) -> None:
        """Orin Nano: the stamp, RAM/SWAP, six cores, GR3D 0%, the hottest zone, VDD_IN as input."""
        s = parsed(ORIN_NANO)
        assert s.stamp == "05-05-2025 06:05:39"
        assert (s.ram_used_mb, s.ram_total_mb, s.swap_used_mb, s.swap_total_mb) == (
            2639,
            7620,
            0,
            3810,
        )
        assert list(s.cpu_loads_pct) == [1, 4, 8, 4, 5, 4]
        assert list(s.cpu_freqs_mhz) == [729] * 6
        assert (s.gpu_busy_pct, s.gpu_freq_mhz) == (0, None)
        assert s.temps_c["gpu"] == 45.968 and s.temp_max_c == 45.968
        assert set(s.rails) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
        assert s.rails["VDD_CPU_GPU_CV"] == Rail(717, 717)
        assert (s.input_rail, s.input_mw) == ("VDD_IN", 5263)

    def test_orin_nx_jetpack5(self) -> None:
        """Orin NX/Nano on JetPack 5: off cores are None, GR3D (not GR3D2) is the GPU, EMC read."""
        s = parsed(ORIN_NX)
        assert list(s.cpu_loads_pct) == [11, 13, 9, 18, None, None]
        assert list(s.cpu_freqs_mhz) == [729, 729, 729, 729, None, None]
        assert (s.gpu_busy_pct, s.gpu_freq_mhz) == (0, 305)
        assert (s.emc_pct, s.emc_freq_mhz) == (0, 2133)
        assert s.temp_max_c == 46.968  # tj and SOC1
        assert (s.input_rail, s.input_mw) == ("VDD_IN", 4915)

    def test_agx_orin_sums_its_rails(self) -> None:
        """AGX Orin prints no total rail: the input is the sum of all four (VIN_SYS_5V0 is one)."""
        s = parsed(AGX_ORIN)
        assert s.input_rail == "sum"
        assert s.input_mw == 3150 + 14312 + 4968 + 1091
        assert s.rails["VIN_SYS_5V0"] == Rail(4968, 5048)
        assert (s.gpu_busy_pct, s.gpu_freq_mhz) == (14, 407)
        assert len(s.cpu_loads_pct) == 12
        assert s.temp_max_c == 77.281
        assert s.ram_total_mb == 62780

    def test_agx_orin_jetpack7_three_values(self) -> None:
        """JetPack 7 rails ``cur/avg/max`` give current and average; ``c/max`` temperatures read."""
        s = parsed(AGX_ORIN_JP7)
        assert s.rails["VDD_CPU_CV"] == Rail(3268, 3268)
        assert (s.input_rail, s.input_mw) == ("sum", 5139 + 3268 + 5500)
        assert s.temps_c == {"cpu": 52.968, "soc2": 48.406, "soc0": 49.531, "gpu": 47.625}
        assert (s.gpu_busy_pct, s.gpu_freq_mhz) == (12, 1300)

    def test_xavier_nx(self) -> None:
        """Xavier NX: VDD_IN is the input; the PMIC placeholder is not the hottest sensor."""
        s = parsed(XAVIER_NX)
        assert (s.input_rail, s.input_mw) == ("VDD_IN", 5079)
        assert s.temps_c["PMIC"] == 50
        assert s.temp_max_c == 39.5
        assert (s.gpu_busy_pct, s.gpu_freq_mhz) == (0, 510)
        assert list(s.cpu_loads_pct[-2:]) == [None, None]

    def test_agx_xavier(self) -> None:
        """AGX Xavier: unit-less rails named GPU/CPU/... are summed; PMIC@100C is left out."""
        s = parsed(AGX_XAVIER)
        assert set(s.rails) == {"GPU", "CPU", "SOC", "CV", "VDDRQ", "SYS5V"}
        assert (s.input_rail, s.input_mw) == ("sum", 0 + 216 + 864 + 0 + 144 + 1889)
        assert s.temps_c["GPU"] == 32  # the zone, beside the rail of the same name
        assert s.temp_max_c == 34.75
        assert s.swap_used_mb is None

    def test_nano_pom_rail(self) -> None:
        """Jetson Nano: POM_5V_IN is the input, not the sum; IRAM is not a rail."""
        s = parsed(NANO)
        assert (s.input_rail, s.input_mw) == ("POM_5V_IN", 4520)
        assert s.rails["POM_5V_CPU"] == Rail(1078, 1205)
        assert "IRAM" not in s.rails
        assert s.temp_max_c == 65

    def test_tx1_shared_frequency(self) -> None:
        """The oldest form ``cpu [a%,b%]@F``: every core gets F; ``GR3D 3%@76``; no power."""
        s = parsed(TX1)
        assert list(s.cpu_loads_pct) == [17, 13, 29, 5]
        assert list(s.cpu_freqs_mhz) == [408] * 4
        assert (s.gpu_busy_pct, s.gpu_freq_mhz, s.emc_pct) == (3, 76, 1)
        assert (s.input_rail, s.input_mw) == (None, None)

    @pytest.mark.parametrize("line", ALL_LINES)
    def test_stamp_changes_nothing_else(self, line: str) -> None:
        """With or without the leading date-time, a line gives the same sample but the stamp."""
        bare = line[20:] if line[:2].isdigit() else line
        stamped = "12-31-2025 23:59:59 " + bare
        assert parsed(bare).stamp is None
        assert parsed(stamped) == dataclasses.replace(parsed(bare), stamp="12-31-2025 23:59:59")

    def test_no_sensor_and_not_connected(self) -> None:
        """A ``-256C`` zone (no sensor) is no reading, and an ``NC`` rail is not in the sum."""
        line = AGX_ORIN.replace("CV0@73.625C", "CV0@-256C") + " NC 0mW/0mW"
        s = parsed(line)
        assert "CV0" not in s.temps_c
        assert "NC" not in s.rails
        assert s.input_mw == parsed(AGX_ORIN).input_mw

    @pytest.mark.parametrize(
        "line",
        ["", "\n", "tegrastats: command not found", "Usage: tegrastats [-option]", "CPU [off,off]"],
    )
    def test_not_a_sample(self, line: str) -> None:
        """A line with neither RAM nor a power rail is not a sample."""
        assert parse_line(line) is None

    def test_input_power_order(self) -> None:
        """VDD_IN wins over POM_5V_IN and over the sum; no rails, no input."""
        rails = {"VDD_IN": Rail(1, 1), "POM_5V_IN": Rail(2, 2), "X": Rail(4, 4)}
        assert input_power(rails) == ("VDD_IN", 1)
        assert input_power({"POM_5V_IN": Rail(2, 2), "X": Rail(4, 4)}) == ("POM_5V_IN", 2)
        assert input_power({"X": Rail(4, 4), "Y": Rail(8, 8)}) == ("sum", 12)
        assert input_power({}) == (None, None)


def constant(power_mw: float, times: list[float]) -> list[tuple[float, TegraSample]]:
    return [(t, TegraSample(input_mw=power_mw)) for t in times]


class TestInterval:
    def test_constant_power(self) -> None:
        """Constant P over [t0, t1] inside the samples: energy P*(t1-t0) mJ, mean P."""
        times = [i * 0.1 for i in range(11)]
        t0, t1, p = 0.234, 0.811, 5000.0
        out = board_fields(constant(p, times), t0, t1, tokens=7)
        assert out.energy_mj == pytest.approx(p * (t1 - t0), abs=1e-3)
        assert out.power_w_avg == pytest.approx(p / 1000.0)
        assert out.energy_mj_per_token == pytest.approx(p * (t1 - t0) / 7, abs=1e-3)

    def test_ramp_is_the_trapezoid(self) -> None:
        """A linear ramp a + b·t is integrated exactly: a(t1-t0) + b(t1²-t0²)/2."""
        a, b = 3000.0, 2000.0
        times = [0.0, 0.13, 0.2, 0.45, 0.5, 0.9, 1.0]
        samples = [(t, TegraSample(input_mw=a + b * t)) for t in times]
        t0, t1 = 0.07, 0.93
        expected = a * (t1 - t0) + b * (t1**2 - t0**2) / 2
        assert board_fields(samples, t0, t1, None).energy_mj == pytest.approx(expected, abs=1e-3)

    def test_trapezoid_with_interpolated_ends(self) -> None:
        """Between uneven samples the area is the sum of trapezoids, the ends interpolated."""
        points = [(0.0, 1000.0), (1.0, 3000.0), (2.0, 2000.0)]
        t0, t1 = 0.5, 1.5
        p0 = value_at(points, t0)
        p1 = value_at(points, t1)
        assert (p0, p1) == (2000.0, 2500.0)
        assert p0 is not None and p1 is not None
        expected = (1.0 - t0) * (p0 + 3000.0) / 2 + (t1 - 1.0) * (3000.0 + p1) / 2
        assert integral(points, t0, t1) == pytest.approx(expected)

    def test_cover(self) -> None:
        """Covered: a sample at or before t0 and one at or after t1; exact hits count."""
        times = [1.0, 2.0, 3.0]
        assert bracket(times, 1.0, 3.0) == (0, 2)
        assert bracket(times, 1.5, 2.5) == (0, 2)
        assert bracket(times, 2.0, 2.0) == (1, 1)
        assert bracket(times, 0.9, 2.0) is None
        assert bracket(times, 2.0, 3.1) is None
        assert bracket(times, 2.5, 1.5) is None

    def test_not_covered_is_none(self) -> None:
        """An interval reaching past the samples gives None for every field."""
        samples = constant(5000.0, [1.0, 2.0])
        for t0, t1 in ((0.5, 1.5), (1.5, 2.5)):
            out = board_fields(samples, t0, t1, 10)
            assert set(fields_of(out).values()) == {None}

    def test_load_fields(self) -> None:
        """GPU % is the time-weighted mean; RAM and temperature the largest bracketing sample."""
        rows = [(0.0, 0.0, 100.0, 40.0), (1.0, 100.0, 300.0, 50.0), (2.0, 100.0, 200.0, 45.0)]
        samples = [
            (t, TegraSample(gpu_busy_pct=g, ram_used_mb=r, temps_c={"gpu": c}))
            for t, g, r, c in rows
        ]
        out = board_fields(samples, 0.5, 2.0, None)
        expected_gpu = (0.5 * (50.0 + 100.0) / 2 + 1.0 * 100.0) / 1.5
        assert out.gpu_busy_pct == pytest.approx(expected_gpu, abs=1e-3)
        assert out.ram_used_mb == max(r for _, _, r, _ in rows)
        assert out.temp_max_c == max(c for *_, c in rows)
        assert out.energy_mj is None  # no rails in these samples

    def test_zero_length_interval(self) -> None:
        """An empty interval has no energy and the interpolated power as its mean."""
        points = [(0.0, 2000.0), (1.0, 4000.0)]
        samples = [(t, TegraSample(input_mw=p)) for t, p in points]
        out = board_fields(samples, 0.25, 0.25, 0)
        assert out.energy_mj == 0
        assert out.power_w_avg == pytest.approx(2.5)
        assert out.energy_mj_per_token is None  # no tokens: no per-token energy

    def test_value_at(self) -> None:
        """Values interpolate between points, equal a point on it, and are None outside."""
        points = [(0.0, 10.0), (2.0, 30.0)]
        assert value_at(points, 0.5) == 15.0
        assert value_at(points, 2.0) == 30.0
        assert value_at(points, -0.1) is None
        assert value_at(points, math.nextafter(2.0, 3.0)) is None
