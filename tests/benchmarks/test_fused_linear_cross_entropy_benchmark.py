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


def test_a_padded_weight_gives_every_provider_the_unpadded_loss():
    device = torch.device("cpu")
    hidden, weight, labels = bench.make_inputs(40, 16, 300, torch.float32, device, rows=320)
    assert weight.shape == (320, 16) and not weight[300:].any()
    # The unpadded loss in float64: log-sum-exp over the 300 real classes, minus the label's logit.
    logits = hidden.double() @ weight[:300].double().T
    scored = labels != -100
    want = (logits.logsumexp(-1) - logits.gather(1, labels.clamp(min=0)[:, None])[:, 0])[scored].mean()
    for provider in ("brickwork", "torch"):
        got = bench.loss_function(provider, device, 8, vocab=300)(hidden, weight, labels)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_chunk_sizes_are_a_brickwork_row_each():
    args = bench.parse_args(["--providers", "brickwork", "torch", "--chunk-size", "256", "1024"])
    assert bench.cases(args) == [("brickwork", 256), ("brickwork", 1024), ("torch", None)]
    args = bench.parse_args(["--tokens", "64", "--dim", "16", "--vocab", "500", "--repeats", "1"])
    assert bench.measure(args, "brickwork", 16)["provider"] == "brickwork, chunk 16"


def test_one_case_reports_peak_memory_and_time():
    args = bench.parse_args(["--tokens", "64", "--dim", "16", "--vocab", "500", "--repeats", "1"])
    row = bench.measure(args, "torch")
    assert row["provider"] == "torch" and row["ms"] > 0 and row["peak_extra_mib"] >= 0


def test_bad_sizes_are_rejected():
    with pytest.raises(SystemExit):
        bench.parse_args(["--chunk-size", "0"])
