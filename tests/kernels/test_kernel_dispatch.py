"""Dispatch: importing never loads triton, CPU defaults to the twins, and the twins trace without breaks."""

import os
import subprocess
import sys

import pytest
import torch

from brickwork import kernels
from brickwork.errors import ConfigError
from brickwork.kernels.backend import triton_interpreted

_IMPORT_PROBE = """
import sys, torch
import brickwork.kernels as k
x, w = torch.randn(2, 3, 8), torch.randn(8)
k.layer_norm(x, w, w); k.rms_norm(x, w); k.bias_gelu(x, w); k.bias_gelu_dropout(x, w, 0.1, 3)
k.masked_softmax(x, causal=True)
print("triton" in sys.modules, k.layer_norm.__module__)
"""


def test_import_and_cpu_calls_never_load_triton():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    assert result.stdout.split() == ["False", "brickwork.kernels"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA present triton compiles for the GPU")
def test_without_cuda_the_kernels_run_in_the_interpreter():
    assert os.environ.get("TRITON_INTERPRET") == "1"
    assert triton_interpreted()


def _all_kernels(x, w, mask):
    h = kernels.layer_norm(x, w, w)
    h = kernels.rms_norm(h, w)
    h = kernels.bias_gelu(h, w, "tanh")
    h = kernels.bias_gelu_dropout(h, w, 0.2, 17)
    return kernels.masked_softmax(h, mask, 0.5, causal=True)


def test_cpu_default_dispatch_traces_without_graph_breaks():
    x, w, mask = torch.randn(2, 8, 8), torch.randn(8), torch.rand(8, 8) > 0.2
    compiled = torch.compile(_all_kernels, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, w, mask), _all_kernels(x, w, mask))


def test_explicit_torch_backend_matches_default_on_cpu():
    x, w, mask = torch.randn(2, 8, 8), torch.randn(8), torch.rand(8, 8) > 0.2
    h = kernels.layer_norm(x, w, w, backend="torch")
    assert torch.equal(h, kernels.layer_norm(x, w, w))
    assert torch.equal(kernels.masked_softmax(h, mask, backend="torch"), kernels.masked_softmax(h, mask))


@pytest.mark.parametrize("backend", ["cuda", "TRITON", ""])
def test_unknown_backend_is_a_config_error_listing_the_choices(backend):
    with pytest.raises(ConfigError, match=r"^backend: unknown kernel backend .*allowed: torch, triton"):
        kernels.rms_norm(torch.randn(2, 4), None, backend=backend)


@pytest.mark.gpu
def test_mixed_devices_are_rejected():
    with pytest.raises(ValueError, match=r"weight is on cpu but x is on cuda"):
        kernels.layer_norm(torch.randn(2, 4, device="cuda"), torch.ones(4), None)
