"""bias-GELU benchmark (tanh approximation): brickwork against eager torch and torch.compile.

Minimal traffic per input element: forward reads x and writes y (2 elements); backward reads x and dy
and writes dx (3; the bias and its gradient are O(width)); forward+backward 5. Neither Liger nor apex
has a bias-GELU, so they do not take part. Run alone with ``python -m benchmarks --kernels bias_gelu``.
"""

import torch
import torch.nn.functional as F

from brickwork.kernels import bias_gelu

from .cases import ROW_TRAFFIC, KernelBench, Target, compiled, eager_provider


def _inputs(rows: int, width: int, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    x = torch.randn(rows, width, dtype=dtype, device=device, requires_grad=True)
    bias = torch.randn(width, dtype=dtype, device=device, requires_grad=True)
    return [x, bias]


def _torch(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + bias, approximate="tanh")


def _brickwork(device: torch.device):
    return lambda x, bias: bias_gelu(x, bias, "tanh")


BENCH = KernelBench(
    name="bias_gelu",
    make_inputs=_inputs,
    providers={"brickwork": _brickwork, "torch": eager_provider(_torch), "torch.compile": compiled(_torch)},
    bytes_per_element=ROW_TRAFFIC,
    targets=(Target("forward", 0.85),),
    summary="y = gelu_tanh(x + bias) over rows of `width`",
)
