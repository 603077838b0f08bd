"""Scaled softmax benchmark: brickwork against eager torch, torch.compile, and Liger where installed.

The scores are [rows, width] with scale 1/8 and no mask, the case the bandwidth targets are set for.
Minimal traffic per input element: forward reads the scores and writes y (2 elements); backward reads
y and dy and writes dx (3); forward+backward 5. Liger's softmax takes no scale, so its provider pays
for an extra eager multiply. Run alone with ``python -m benchmarks --kernels masked_softmax``.
"""

import torch

from brickwork.kernels import masked_softmax

from .cases import ROW_TRAFFIC, KernelBench, Target, compiled, eager_provider, optional_function, row_inputs

SCALE = 0.125


def _torch(scores: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores * SCALE, dim=-1)


def _liger(device: torch.device):
    fn = optional_function("liger_kernel.transformers.functional", "liger_softmax", device)
    return None if fn is None else (lambda scores: fn(scores * SCALE))


BENCH = KernelBench(
    name="masked_softmax",
    make_inputs=row_inputs(0),
    providers={
        "brickwork": eager_provider(lambda scores: masked_softmax(scores, None, SCALE)),
        "torch": eager_provider(_torch),
        "torch.compile": compiled(_torch),
        "liger": _liger,
    },
    bytes_per_element=ROW_TRAFFIC,
    targets=(Target("forward", 0.85, 1024, 16384), Target("backward", 0.75)),
    summary="y = softmax(scores / 8) over rows of `width`",
)
