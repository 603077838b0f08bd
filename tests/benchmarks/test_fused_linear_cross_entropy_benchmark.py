"""The LM-head loss benchmark: its providers compute the same loss, and a case measures time and memory."""

import pytest
import torch

from brickwork.benchmarks import fused_linear_cross_entropy as bench


def test_providers_agree_on_the_loss():
    device = torch.device("cpu")
    inputs = bench.make_inputs(40, 16, 300, torch.float32, device)
    losses = {p: bench.loss_function(p, device, chunk_size=8) for p in ("brickwork", "torch")}
    torch.testing.assert_close(losses["brickwork"](*inputs), losses["torch"](*inputs))
    assert bench.loss_function("liger", device) is None  # CUDA only


def test_one_case_reports_peak_memory_and_time():
    args = bench.parse_args(["--tokens", "64", "--dim", "16", "--vocab", "500", "--repeats", "1"])
    row = bench.measure(args, "torch")
    assert row["provider"] == "torch" and row["ms"] > 0 and row["peak_extra_mib"] >= 0


def test_bad_sizes_are_rejected():
    with pytest.raises(SystemExit):
        bench.parse_args(["--chunk-size", "0"])
