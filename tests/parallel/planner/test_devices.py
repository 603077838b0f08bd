"""The device table: the peak a precision divides by, and which preset a GPU's torch name maps to."""

from __future__ import annotations

import pytest
import torch

from brickwork.parallel.planner.devices import DEVICE_PRESETS, preset_for, running_preset

GIB = 1024**3

# (torch.cuda.get_device_name, total_memory in GiB as torch reports it) -> preset name, or None.
BOARDS = [
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
    ("NVIDIA A100-PCIE-40GB", 39.6, "A100-40GB"),
    ("NVIDIA A100-SXM4-80GB", 79.3, "A100-80GB"),
    ("NVIDIA A100 80GB PCIe", 79.2, "A100-80GB"),
    ("NVIDIA H100 80GB HBM3", 79.2, "H100-80GB"),
    ("NVIDIA H200", 139.8, "H200"),
    # Lower peaks than the SXM boards the presets describe, or no preset at all.
    ("NVIDIA H100 PCIe", 79.2, None),
    ("NVIDIA H100 NVL", 93.1, None),
    ("NVIDIA H200 NVL", 139.8, None),
    ("NVIDIA GH200 480GB", 94.5, None),
    ("NVIDIA GeForce RTX 4090", 23.6, None),
    ("Tesla V100-SXM2-16GB", 15.8, None),
]


@pytest.mark.parametrize(("name", "gib", "preset"), BOARDS)
def test_a_gpu_maps_to_the_preset_of_its_board(name: str, gib: float, preset: str | None) -> None:
    found = preset_for(name, int(gib * GIB))
    assert (found.name if found is not None else None) == preset


def test_a_cpu_has_no_preset() -> None:
    assert running_preset(torch.device("cpu")) is None


def test_the_peak_is_the_data_sheets_at_the_precision_of_the_matmuls() -> None:
    h100 = DEVICE_PRESETS["H100-80GB"]
    # NVIDIA's H100 SXM data sheet, dense: 989 TFLOP/s bf16 and fp16 tensor core, 67 TFLOP/s fp32.
    assert h100.peak_flops("fp32") == 67e12
    for precision in ("bf16", "bf16-mixed", "fp16"):
        assert h100.peak_flops(precision) == 989e12
    assert h100.rate("bf16") == pytest.approx(989e12 * 0.57)  # fitted to published runs (docs)
    # Fused attention at its own fraction, fp8 steps included (their attention runs in bf16).
    assert h100.attention_rate("fp8") == h100.attention_rate("bf16") == pytest.approx(989e12 * 0.30)
    a100 = DEVICE_PRESETS["A100-80GB"]  # no fraction of its own: attention at the matmuls' rate
    assert a100.attention_rate("bf16") == a100.rate("bf16")
