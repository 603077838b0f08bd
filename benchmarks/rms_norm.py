"""RMSNorm benchmark: brickwork against eager torch, torch.compile, and Liger / apex where installed.

Minimal traffic per input element: forward reads x and writes y (2 elements); backward reads x and dy
and writes dx (3); forward+backward 5. The weight and the per-row rstd are left out.
Run alone with ``python -m benchmarks --kernels rms_norm``.
"""

import torch
import torch.nn.functional as F

from brickwork.kernels import rms_norm

from .cases import ROW_TRAFFIC, KernelBench, Target, compiled, eager_provider, optional_function, row_inputs

EPS = 1e-6


def _torch(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, x.shape[-1:], weight, EPS)


def _brickwork(device: torch.device):
    # The kernel on CUDA (where RMSNorm's default backend takes torch's twin), the twin elsewhere.
    backend = "triton" if device.type == "cuda" else None
    return lambda x, weight: rms_norm(x, weight, EPS, backend=backend)


def _liger(device: torch.device):
    fn = optional_function("liger_kernel.transformers.functional", "liger_rms_norm", device)
    return None if fn is None else (lambda x, weight: fn(x, weight, EPS))


def _apex(device: torch.device):
    fn = optional_function("apex.normalization.fused_layer_norm", "fused_rms_norm_affine", device)
    return None if fn is None else (lambda x, weight: fn(x, weight, x.shape[-1:], EPS))


BENCH = KernelBench(
    name="rms_norm",
    make_inputs=row_inputs(1),  # weight
    providers={
        "brickwork": _brickwork,
        "torch": eager_provider(_torch),
        "torch.compile": compiled(_torch),
        "liger": _liger,
        "apex": _apex,
    },
    bytes_per_element=ROW_TRAFFIC,
    targets=(Target("forward", 0.90, 4096, 16384), Target("backward", 0.60, 4096, 16384)),
    summary="y = x / rms(x) * weight over rows of `width`",
)
