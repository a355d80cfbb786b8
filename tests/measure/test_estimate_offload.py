"""estimate.offload: byte counts against the worked example, errors, and the step-time model."""

from __future__ import annotations

import pytest

from course_lib.measure import estimate


def test_seven_billion_bf16_mixed_optimizer_offload_is_the_worked_example():
    # S2/S4 accounting: 7B, bf16 params + grads on the GPU (4 B), master + m + v on the host (12 B)
    split = estimate.offload_split(7e9, level="optimizer")
    assert split == {
        "device": 28 * 10**9,
        "host": 84 * 10**9,
        "to_host": 14 * 10**9,
        "to_device": 14 * 10**9,
    }
    t = estimate.offload_transfer_times(
        7e9, link_GBps=estimate.link_speed("PCIe 4.0 x16").per_direction_GBps
    )
    assert t["to_host_s"] == t["to_device_s"] == pytest.approx(0.4375)
    assert t["duplex_s"] == pytest.approx(0.4375) and t["serial_s"] == pytest.approx(0.875)


@pytest.mark.parametrize(
    "level, device, host, down, up",
    [
        ("none", 16, 0, 0, 0),
        ("optimizer", 4, 12, 2, 2),
        ("optimizer+grads", 2, 14, 2, 2),
        ("all", 0, 16, 2, 4),
    ],
)
def test_levels_bytes_per_param_bf16_mixed_adam(level, device, host, down, up):
    n = 1000
    s = estimate.offload_split(n, level=level)
    assert (s["device"], s["host"], s["to_host"], s["to_device"]) == (
        device * n,
        host * n,
        down * n,
        up * n,
    )
    # nothing is lost: device + host is the whole model state
    assert s["device"] + s["host"] == estimate.model_state_bytes(n, precision="bf16-mixed")["total"]


def test_fp32_offload_keeps_a_host_copy_of_the_weights():
    s = estimate.offload_split(10, level="optimizer", precision="fp32")
    assert s == {"device": 80, "host": 120, "to_host": 40, "to_device": 40}
    assert estimate.offload_split(10, level="optimizer", optimizer="sgd")["host"] == 40


def test_nvme_and_host_adam():
    assert estimate.nvme_traffic_bytes(7e9) == {"read": 84 * 10**9, "write": 84 * 10**9}
    assert estimate.host_adam_time(10**9, host_GBps=28.0) == pytest.approx(1.0)
    assert estimate.transfer_time(0, 1.0) == 0.0


def test_step_time_model_overlap_and_serial():
    kw = dict(compute_s=0.3, transfer_s=0.4375, host_s=1.2)
    assert estimate.offload_step_time(**kw) == 1.2
    assert estimate.offload_step_time(**kw, overlap=False) == pytest.approx(1.9375)
    assert estimate.offload_step_time(**kw, storage_s=2.0) == 2.0


def test_bad_input_names_parameter_value_and_choices():
    with pytest.raises(ValueError, match=r"level = 'cpu'.*none, optimizer, optimizer\+grads, all"):
        estimate.offload_split(10, level="cpu")
    with pytest.raises(ValueError, match="precision = 'bf16-true'"):
        estimate.offload_split(10, precision="bf16-true")
    with pytest.raises(ValueError, match="GBps"):
        estimate.transfer_time(10, 0)
    with pytest.raises(ValueError, match="compute_s"):
        estimate.offload_step_time(compute_s=-1, transfer_s=0, host_s=0)
    with pytest.raises(TypeError, match="overlap"):
        estimate.offload_step_time(compute_s=1, transfer_s=0, host_s=0, overlap="yes")
