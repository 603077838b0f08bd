"""The pure-torch twins of the Triton kernels: the CPU path and the test oracle.

Each twin computes what its kernel computes: half-precision inputs are upcast to float32, the math
(statistics included) runs there, and the result is rounded once to the input dtype. float32 and
float64 inputs are computed in their own dtype, so ``torch.autograd.gradcheck`` can run on them.
They take the same arguments as the public functions but do no input checks of their own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .philox import dropout_keep_mask


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32


def _upcast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return None if t is None else t.to(dtype)


def layer_norm_ref(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm over the last dim. x [..., N]; weight, bias [N] or None -> [..., N] in x's dtype."""
    ct = _compute_dtype(x)
    y = F.layer_norm(x.to(ct), x.shape[-1:], _upcast(weight, ct), _upcast(bias, ct), eps)
    return y.to(x.dtype)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim: ``x / sqrt(mean(x**2) + eps) * weight``. x [..., N]; weight [N]."""
    ct = _compute_dtype(x)
    return F.rms_norm(x.to(ct), x.shape[-1:], _upcast(weight, ct), eps).to(x.dtype)


def bias_gelu_ref(x: torch.Tensor, bias: torch.Tensor | None, approximate: str = "none") -> torch.Tensor:
    """``gelu(x + bias)``. x [..., N]; bias [N] or None; approximate "none" or "tanh"."""
    return bias_gelu_dropout_ref(x, bias, 0.0, 0, approximate)


def bias_gelu_dropout_ref(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    p: float,
    seed: int,
    approximate: str = "none",
    training: bool = True,
) -> torch.Tensor:
    """``dropout(gelu(x + bias), p)`` with the kernel's Philox mask for ``seed``. x [..., N]; bias [N].

    Element ``i`` in row-major order of x's shape is kept when the Philox bits for (seed, i) pass
    :func:`brickwork.kernels.philox.dropout_threshold`; kept values are scaled by ``1 / (1 - p)``.
    """
    ct = _compute_dtype(x)
    y = F.gelu(x.to(ct) if bias is None else x.to(ct) + bias.to(ct), approximate=approximate)
    if training and p > 0:
        keep = dropout_keep_mask(seed, p, x.numel(), x.device).view(x.shape)
        y = torch.where(keep, y * (1.0 / (1.0 - p)), 0.0)
    return y.to(x.dtype)


def masked_softmax_ref(
    scores: torch.Tensor, mask: torch.Tensor | None = None, scale: float = 1.0, causal: bool = False
) -> torch.Tensor:
    """``softmax(scores * scale + mask)`` over the last dim. scores [..., Tq, Tk] -> same shape.

    A bool mask keeps True entries; a float mask is added. ``causal`` drops key j for query i when
    ``j > i + Tk - Tq`` (bottom-right aligned). Rows with nothing left give zeros and zero gradient.
    """
    ct = _compute_dtype(scores)
    s = scores.to(ct) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.to(ct)
    if causal:
        tq, tk = s.shape[-2], s.shape[-1]
        allowed = torch.ones(tq, tk, dtype=torch.bool, device=s.device).tril(tk - tq)
        s = s.masked_fill(~allowed, float("-inf"))
    # Softmax of an all -inf row is 0/0; give such rows finite logits, then zero them, so that both the
    # output and the gradient are exactly zero there.
    dead = s.amax(dim=-1, keepdim=True) == float("-inf")
    y = torch.softmax(s.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    return y.to(scores.dtype)


def cross_entropy_chunk_ref(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, compute_grad: bool, n_classes: int
) -> torch.Tensor:
    """The twin of the Triton cross-entropy chunk step. logits [C, W], labels [C] -> float32 losses [C].

    The first ``n_classes`` columns are the classes, any others padding. ``loss = logsumexp(row) -
    row[label]`` in float32 (float64 stays float64); rows labelled ``ignore_index`` get 0. With
    ``compute_grad`` the logits are overwritten with ``softmax(row) - onehot(label)`` (zero rows where
    ignored, zero padding columns), so the chunk needs no second buffer.
    """
    ct = _compute_dtype(logits)
    log_probs = torch.log_softmax(logits[:, :n_classes].to(ct), dim=-1)
    kept = labels != ignore_index
    safe = labels.masked_fill(~kept, 0).unsqueeze(-1)
    losses = torch.where(kept, -log_probs.gather(-1, safe).squeeze(-1), 0.0)
    if compute_grad:
        grad = log_probs.exp_()  # the softmax, in the log-probabilities' buffer
        grad.scatter_add_(-1, safe, torch.full_like(safe, -1, dtype=ct))
        logits[:, :n_classes].copy_(grad.masked_fill_(~kept.unsqueeze(-1), 0.0))
        logits[:, n_classes:] = 0
    return losses
