"""LayerNorm benchmark: brickwork against eager torch, torch.compile, and Liger / apex where installed.

Minimal traffic per input element: forward reads x and writes y (2 elements); backward reads x and dy
and writes dx (3); forward+backward 5. Weight, bias and the per-row statistics are O(width + rows)
and left out. Run alone with ``python -m benchmarks --kernels layer_norm``.
"""

import torch
import torch.nn.functional as F

from brickwork.kernels import layer_norm

from .cases import ROW_TRAFFIC, KernelBench, Target, compiled, eager_provider, optional_function, row_inputs

EPS = 1e-5


def _torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, EPS)


def _liger(device: torch.device):
    fn = optional_function("liger_kernel.transformers.functional", "liger_layer_norm", device)
    return None if fn is None else (lambda x, weight, bias: fn(x, weight, bias, EPS))


def _apex(device: torch.device):
    fn = optional_function("apex.normalization.fused_layer_norm", "fused_layer_norm_affine", device)
    return None if fn is None else (lambda x, weight, bias: fn(x, weight, bias, x.shape[-1:], EPS))


BENCH = KernelBench(
    name="layer_norm",
    make_inputs=row_inputs(2),  # weight, bias
    providers={
        "brickwork": eager_provider(lambda x, weight, bias: layer_norm(x, weight, bias, EPS)),
        "torch": eager_provider(_torch),
        "torch.compile": compiled(_torch),
        "liger": _liger,
        "apex": _apex,
    },
    bytes_per_element=ROW_TRAFFIC,
    targets=(Target("forward", 0.90, 4096, 16384), Target("backward", 0.60, 4096, 16384)),
    summary="y = LayerNorm(x) * weight + bias over rows of `width`",
)
