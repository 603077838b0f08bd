"""Fused kernels with pure-torch twins, chosen per call.

Every function is differentiable and takes ``backend``: ``None`` runs the Triton kernel for CUDA
tensors and the torch twin elsewhere (RMSNorm takes its twin everywhere: ``rms_norm_uses_triton``),
``"torch"`` always runs the twin, and ``"triton"`` always runs the kernel (on CPU tensors through
Triton's interpreter, see ``backend`` and :func:`use_triton_interpreter`). Importing this package
never imports triton and sets nothing; the first Triton call imports it.
"""

from __future__ import annotations

import torch

from ._checks import check_dropout, check_gelu, check_norm, check_softmax
from .backend import rms_norm_uses_triton, use_triton, use_triton_interpreter
from .linear_cross_entropy import check_linear_cross_entropy, linear_cross_entropy_torch
from .reference import (
    bias_gelu_dropout_ref,
    bias_gelu_ref,
    layer_norm_ref,
    masked_softmax_ref,
    rms_norm_ref,
)

__all__ = [
    "bias_gelu",
    "bias_gelu_dropout",
    "bias_gelu_dropout_ref",
    "bias_gelu_ref",
    "fused_linear_cross_entropy",
    "layer_norm",
    "layer_norm_ref",
    "masked_softmax",
    "masked_softmax_ref",
    "rms_norm",
    "rms_norm_ref",
    "use_triton_interpreter",
]

# Each function checks its inputs once: the twin's path here, the Triton path in its ``*_triton`` entry
# (for the fused loss, whose two paths differ only in the chunk step, here too).


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    backend: str | None = None,
) -> torch.Tensor:
    """LayerNorm over the last dimension. x [..., N]; weight, bias [N] or None -> [..., N] in x's dtype."""
    if use_triton(backend, x):
        from .fused.layer_norm import layer_norm_triton

        return layer_norm_triton(x, weight, bias, eps)
    check_norm(x, weight, bias, eps)
    return layer_norm_ref(x, weight, bias, eps)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, backend: str | None = None
) -> torch.Tensor:
    """RMSNorm over the last dimension. x [..., N]; weight [N] or None -> [..., N] in x's dtype."""
    if rms_norm_uses_triton(backend, x):
        from .fused.rms_norm import rms_norm_triton

        return rms_norm_triton(x, weight, eps)
    check_norm(x, weight, None, eps)
    return rms_norm_ref(x, weight, eps)


def bias_gelu(
    x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none", backend: str | None = None
) -> torch.Tensor:
    """``gelu(x + bias)``. x [..., N]; bias [N] or None; approximate "none" (erf) or "tanh"."""
    return bias_gelu_dropout(x, bias, 0.0, 0, approximate, backend=backend)


def bias_gelu_dropout(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    p: float,
    seed: int,
    approximate: str = "none",
    training: bool = True,
    backend: str | None = None,
) -> torch.Tensor:
    """``dropout(gelu(x + bias), p)`` with a Philox mask drawn from ``seed``. x [..., N]; bias [N] or None.

    No mask is stored: the backward pass redraws it. The same (seed, shape) gives the same mask on every
    backend and device; pass a fresh seed each step. ``training=False`` (or ``p=0``) is ``bias_gelu``.
    """
    check_dropout(p, seed)  # before training=False drops p, so that a bad p is never accepted
    p = p if training else 0.0
    if use_triton(backend, x):
        from .fused.bias_gelu import bias_gelu_triton

        return bias_gelu_triton(x, bias, approximate, p, seed)
    check_gelu(x, bias, approximate)
    return bias_gelu_dropout_ref(x, bias, p, seed, approximate)


def masked_softmax(
    scores: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float = 1.0,
    causal: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """``softmax(scores * scale + mask)`` over the last dim. scores [..., Tq, Tk] -> same shape and dtype.

    ``mask`` broadcasts to scores: bool (True = may attend) or float (added). ``causal`` hides key j from
    query i when ``j > i + Tk - Tq`` (bottom-right aligned). Rows with nothing to attend to give zeros
    and zero gradient.
    """
    if use_triton(backend, scores):
        from .fused.masked_softmax import masked_softmax_triton

        return masked_softmax_triton(scores, mask, scale, causal)
    check_softmax(scores, mask, causal)
    return masked_softmax_ref(scores, mask, scale, causal)


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
    backend: str | None = None,
    *,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """``cross_entropy(hidden @ weight.T + bias, labels)`` without materialising the logits.

    hidden [..., D], weight [V, D] (same dtype), bias [V] or None, labels [...] (int64 or int32; entries
    equal to ``ignore_index`` are not scored) -> a float32 scalar. ``reduction="sum"`` is the sum over
    scored tokens; ``"mean"`` divides it by their count, ``(labels != ignore_index).sum()`` (NaN when
    that is 0, as in torch). A training step that needs a sum and a count uses ``"sum"`` and counts
    itself. Tokens are processed ``chunk_size`` at a time (default: the largest power of two whose float32
    logits fit 256 MiB, see ``linear_cross_entropy.default_chunk_size``); the
    logits are computed in the weight's dtype and the softmax in float32. Differentiable in hidden,
    weight and bias: the forward pass computes their gradients, the backward pass scales them. The torch
    path does not chunk logits that fit one chunk (``linear_cross_entropy.linear_cross_entropy_torch``).

    ``vocab_size`` is the real vocabulary of a weight that holds padding rows after it (a model's
    ``vocab_multiple``): only the first ``vocab_size`` classes are scored (labels must lie below it),
    the padding takes part in no softmax, and its rows (and bias entries) get zero gradient. None: every
    row is a class.
    """
    check_linear_cross_entropy(hidden, weight, labels, bias, ignore_index, reduction, chunk_size, vocab_size)
    args = (hidden, weight, labels, bias, ignore_index, reduction, chunk_size)
    if use_triton(backend, hidden):
        from .fused.cross_entropy import cross_entropy_chunk_forward
        from .fused.launch import check_launch
        from .linear_cross_entropy import linear_cross_entropy

        # The chunk step launches the kernel directly; while compiling, the loss takes no chunk step
        # (``linear_cross_entropy.checkpointed_chunks``).
        check_launch("hidden", hidden)
        return linear_cross_entropy(*args, cross_entropy_chunk_forward, vocab_size=vocab_size)
    return linear_cross_entropy_torch(*args, vocab_size=vocab_size)
