"""Input checks shared by the public functions and the Triton entry points (each call checks once).

User mistakes raise ``ValueError`` (shapes, devices, values), ``TypeError`` (dtypes) or ``ConfigError``
(options), each naming the offending value and what is allowed.
"""

from __future__ import annotations

import torch

from brickwork.errors import ConfigError

# What the Triton kernels load and store; the torch twins also take float64 (used by gradcheck).
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
GELU_APPROXIMATIONS = ("none", "tanh")


def check_float(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...] | None = None) -> None:
    """Raise TypeError unless ``t`` is floating point (and, if given, one of ``allowed``)."""
    ok = t.dtype in allowed if allowed is not None else t.is_floating_point()
    if not ok:
        choices = ", ".join(str(d) for d in allowed) if allowed is not None else "a floating dtype"
        raise TypeError(f"{name} has dtype {t.dtype}; expected {choices}")


def check_rows(name: str, x: torch.Tensor) -> int:
    """Return the width N of ``x`` [..., N]; raise ValueError for a 0-d tensor or N == 0."""
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last dimension, got shape {tuple(x.shape)}")
    return x.shape[-1]


def check_vector(name: str, v: torch.Tensor | None, n: int, x: torch.Tensor) -> None:
    """Raise unless ``v`` is None or a float tensor of shape [n] on the device of ``x``."""
    if v is None:
        return
    check_float(name, v)
    if tuple(v.shape) != (n,):
        raise ValueError(f"{name} must have shape ({n},) to match the last dim of x, got {tuple(v.shape)}")
    if v.device != x.device:
        raise ValueError(f"{name} is on {v.device} but x is on {x.device}")


def check_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> None:
    """Checks for layer_norm / rms_norm: x [..., N] float, weight and bias [N], eps >= 0."""
    check_float("x", x)
    n = check_rows("x", x)
    check_vector("weight", weight, n, x)
    check_vector("bias", bias, n, x)
    if not eps >= 0:
        raise ConfigError(f"eps must be a number >= 0, got {eps!r}", path="eps")


def check_gelu(x: torch.Tensor, bias: torch.Tensor | None, approximate: str) -> None:
    """Checks for bias_gelu: x [..., N] float, bias [N], approximate in GELU_APPROXIMATIONS."""
    if approximate not in GELU_APPROXIMATIONS:
        raise ConfigError(
            f"unknown GELU approximation {approximate!r}",
            path="approximate",
            choices=GELU_APPROXIMATIONS,
            got=approximate,
        )
    check_float("x", x)
    check_vector("bias", bias, check_rows("x", x), x)


def check_dropout(p: float, seed: int) -> None:
    """p in [0, 1); seed an int in [0, 2**63) (the Philox key is its two 32-bit halves)."""
    if not 0.0 <= p < 1.0:
        raise ConfigError(f"dropout probability p must be in [0, 1), got {p!r}", path="p")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ConfigError(f"seed must be an int in [0, 2**63), got {seed!r}", path="seed")


def check_softmax(scores: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> None:
    """scores [..., Tq, Tk] float; mask bool or float, broadcastable to scores without growing it."""
    check_float("scores", scores)
    check_rows("scores", scores)
    if causal and scores.dim() < 2:
        raise ValueError(f"causal=True needs scores of shape [..., Tq, Tk], got {tuple(scores.shape)}")
    if mask is None:
        return
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"mask has dtype {mask.dtype}; expected torch.bool (True = may attend) or a float dtype"
        )
    try:
        fits = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to scores of shape {tuple(scores.shape)}"
        )
    if mask.device != scores.device:
        raise ValueError(f"mask is on {mask.device} but scores are on {scores.device}")
