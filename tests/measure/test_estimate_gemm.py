"""estimate.gemm_time: one product's time from its shape (waves of output tiles on the SMs, the
memory roofline), calibrated on the H100 figures of the course's GPU check
(docs/gpu-check-2026-11-27.md); hand-derived tiles, waves and bounds."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate as E

H100 = E.GEMM_CALIBRATIONS["H100 bf16"]


def test_the_calibration_reproduces_the_figures_it_was_measured_on():
    # bf16: 752.9 TFLOP/s at 8192^3 on an H100 (989 dense peak); FP8: 1,339 of 1,979
    assert E.gemm_efficiency(8192, 8192, 8192, H100) * 989e12 == pytest.approx(752.9e12)
    fp8 = E.GEMM_CALIBRATIONS["H100 fp8"]
    assert E.gemm_efficiency(8192, 8192, 8192, fp8) * 1979e12 == pytest.approx(1339e12)
    # 8192^3: 64 x 32 = 2,048 tiles of 128 x 256 on 132 SMs, 16 waves, 2,048 / 2,112 used
    assert H100.ceiling == pytest.approx(752.9 / 989 / (2048 / (16 * 132)))
    assert E.GEMM_CALIBRATIONS["A100 bf16"].ceiling == H100.ceiling  # assumed, said so


def test_waves_and_tiles_by_hand():
    # 4096 x 2304 output: 32 x 9 = 288 tiles, 3 waves of 132: 288 / 396 of the ceiling
    assert E.gemm_efficiency(4096, 2304, 9216, H100) == pytest.approx(H100.ceiling * 288 / 396)
    # a 100 x 100 output fills 10,000 / 32,768 of one tile, one wave of one SM's tile ... and
    # the other 131 SMs idle: 10,000 / (132 x 32,768) of the ceiling, unless bytes hold it
    t = E.gemm_time(100, 100, 100_000, H100)
    compute = 2 * 100 * 100 * 100_000 / (10_000 / (132 * 128 * 256)) / (H100.ceiling * 989e12)
    assert t == pytest.approx(compute)
    # the fraction grows with the size of a square product
    effs = [E.gemm_efficiency(n, n, n, H100) for n in (256, 512, 1024, 2048)]
    assert effs == sorted(effs) and effs[-1] <= H100.ceiling


def test_a_thin_product_is_held_by_its_bytes():
    # 16 experts of 32 rows (tokens) x 2048 -> 1536, one grouped product: 16 x 6 = 96 tiles,
    # one wave (2 x 128 x 256 x 2048 FLOPs at ceiling x 989 / 132 per SM), below the time of
    # its bytes, 16 x 2 (32 x 2048 + 2048 x 1536 + 32 x 1536) at 3.35 TB/s
    moved = 16 * 2 * (32 * 2048 + 2048 * 1536 + 32 * 1536)
    wave = 2 * 128 * 256 * 2048 / (H100.ceiling * 989e12 / 132)
    assert moved / 3.35e12 > wave
    assert E.gemm_time(32, 1536, 2048, H100, batch=16) == pytest.approx(moved / 3.35e12)
    # one expert alone is held by its one wave: 6 of 132 SMs busy
    assert E.gemm_time(32, 1536, 2048, H100) == pytest.approx(wave)
    # extra bytes (scores written to memory) count with the operands
    assert E.gemm_time(32, 1536, 2048, H100, batch=16, extra_bytes=3.35e12) == pytest.approx(
        1 + moved / 3.35e12
    )
    with pytest.raises(ValueError, match="m = 0: expected an int >= 1"):
        E.gemm_time(0, 1, 1, H100)


def test_calibrate_gemm_checks_its_figure():
    with pytest.raises(ValueError, match="achieved_flops = -1"):
        E.calibrate_gemm(8192, -1, peak_flops=1e15, mem_bandwidth=1e12, sms=100)
