"""bias-GELU benchmark (tanh approximation): brickwork against eager torch and torch.compile.

Minimal traffic per input element: forward reads x and writes y (2 elements); backward reads x and dy
and writes dx (3; the bias and its gradient are O(width)); forward+backward 5. Neither Liger nor apex
has a bias-GELU, so they do not take part. Run alone with ``python -m benchmarks --kernels bias_gelu``.
"""

import torch
import torch.nn.functional as F

from brickwork.kernels import bias_gelu

from .cases import ROW_TRAFFIC, KernelBench, Target, compiled, eager_provider, row_inputs


def _torch(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + bias, approximate="tanh")


BENCH = KernelBench(
    name="bias_gelu",
    make_inputs=row_inputs(1),  # bias
    providers={
        "brickwork": eager_provider(lambda x, bias: bias_gelu(x, bias, "tanh")),
        "torch": eager_provider(_torch),
        "torch.compile": compiled(_torch),
    },
    bytes_per_element=ROW_TRAFFIC,
    targets=(Target("forward", 0.85),),
    summary="y = gelu_tanh(x + bias) over rows of `width`",
)
