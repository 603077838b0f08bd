"""Fused scale + mask + softmax over the last dimension: Triton kernels, launchers, autograd.

Scores are viewed as [B, H, Tq, Tk] through their strides, and so is the mask after broadcasting (a
stride-0 view, never materialised), so a [B, 1, Tq, Tk] or [Tq, Tk] mask costs no extra memory. One
program handles one row. Logits are float32: ``scores * scale`` first, then the mask (bool: False
becomes -inf; float: added), then the bottom-right-aligned causal limit. A row that fits one block is
read once; wider rows use the online softmax (Milakov & Gimelshein, 2018): one pass keeps a running
max and a running sum rescaled to it, a second writes the output. A row with every logit at -inf gets
zeros, not 0/0. The backward pass needs only the output y: ``dx = scale * y * (dy - sum(y * dy))``.
"""

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .._checks import KERNEL_DTYPES, check_float, check_grad, check_softmax
from ._launch import DEFAULT_MAX_BLOCK, check_launch, row_block, warps_for

_NO_MASK, _BOOL_MASK, _ADDITIVE_MASK = 0, 1, 2


@triton.jit
def _masked_logits(
    s_row, m_row, cols, s_stride_k, m_stride_k, n_keys, last_key, scale,
    MASK: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    inside = cols < n_keys
    logits = tl.load(s_row + cols * s_stride_k, mask=inside, other=0.0).to(tl.float32) * scale
    if MASK == 1:
        keep = tl.load(m_row + cols * m_stride_k, mask=inside, other=0)
        logits = tl.where(keep != 0, logits, float("-inf"))
    if MASK == 2:
        logits += tl.load(m_row + cols * m_stride_k, mask=inside, other=0.0).to(tl.float32)
    if CAUSAL:
        logits = tl.where(cols <= last_key, logits, float("-inf"))
    return tl.where(inside, logits, float("-inf"))


@triton.jit
def _masked_softmax_fwd_kernel(
    s_ptr, mask_ptr, y_ptr, s_stride_b, s_stride_h, s_stride_q, s_stride_k,
    m_stride_b, m_stride_h, m_stride_q, m_stride_k, n_heads, n_queries, n_keys, scale,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    q = row % n_queries
    h = (row // n_queries) % n_heads
    b = row // (n_queries * n_heads)
    s_row = s_ptr + b * s_stride_b + h * s_stride_h + q * s_stride_q
    m_row = mask_ptr + b * m_stride_b + h * m_stride_h + q * m_stride_q
    y_row = y_ptr + row * n_keys
    # Causal, aligned to the bottom right: query q sees keys 0 .. q + Tk - Tq.
    last_key = q + n_keys - n_queries
    if SINGLE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        logits = _masked_logits(
            s_row, m_row, cols, s_stride_k, m_stride_k, n_keys, last_key, scale, MASK, CAUSAL
        )
        row_max = tl.max(logits, axis=0)
        # A fully masked row has max -inf; shifting by 0 instead makes every exp 0, the sum 0, and y 0.
        e = tl.exp(logits - tl.where(row_max == float("-inf"), 0.0, row_max))
        total = tl.sum(e, axis=0)
        y = e / tl.where(total > 0.0, total, 1.0)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_keys)
    else:
        row_max = float("-inf")
        total = 0.0
        for start in range(0, n_keys, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            logits = _masked_logits(
                s_row, m_row, cols, s_stride_k, m_stride_k, n_keys, last_key, scale, MASK, CAUSAL
            )
            new_max = tl.maximum(row_max, tl.max(logits, axis=0))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            total = total * tl.exp(row_max - shift) + tl.sum(tl.exp(logits - shift), axis=0)
            row_max = new_max
        shift = tl.where(row_max == float("-inf"), 0.0, row_max)
        inverse = 1.0 / tl.where(total > 0.0, total, 1.0)
        for start in range(0, n_keys, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            logits = _masked_logits(
                s_row, m_row, cols, s_stride_k, m_stride_k, n_keys, last_key, scale, MASK, CAUSAL
            )
            y = tl.exp(logits - shift) * inverse
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_keys)


@triton.jit
def _masked_softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr, dy_stride_b, dy_stride_h, dy_stride_q, dy_stride_k, n_heads, n_queries, n_keys,
    scale, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    q = row % n_queries
    h = (row // n_queries) % n_heads
    b = row // (n_queries * n_heads)
    dy_row = dy_ptr + b * dy_stride_b + h * dy_stride_h + q * dy_stride_q
    y_row = y_ptr + row * n_keys
    dx_row = dx_ptr + row * n_keys
    if SINGLE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        inside = cols < n_keys
        y = tl.load(y_row + cols, mask=inside, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols * dy_stride_k, mask=inside, other=0.0).to(tl.float32)
        dx = scale * y * (dy - tl.sum(y * dy, axis=0))
        tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)
    else:
        dot = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_keys, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            inside = cols < n_keys
            y = tl.load(y_row + cols, mask=inside, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * dy_stride_k, mask=inside, other=0.0).to(tl.float32)
            dot += y * dy
        y_dot_dy = tl.sum(dot, axis=0)
        for start in range(0, n_keys, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            inside = cols < n_keys
            y = tl.load(y_row + cols, mask=inside, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * dy_stride_k, mask=inside, other=0.0).to(tl.float32)
            tl.store(dx_row + cols, (scale * y * (dy - y_dot_dy)).to(dx_ptr.dtype.element_ty), mask=inside)


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """[..., Tq, Tk] (or [Tk]) -> [B, H, Tq, Tk], a view unless three or more leading dims cannot merge."""
    if t.dim() == 1:
        return t.view(1, 1, 1, -1)
    if t.dim() <= 4:
        return t.view((1,) * (4 - t.dim()) + tuple(t.shape))
    return t.reshape(-1, *t.shape[-3:])


def masked_softmax_forward(
    scores: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
    max_block: int = DEFAULT_MAX_BLOCK,
) -> torch.Tensor:
    """scores [..., Tq, Tk], mask broadcastable to it (bool or float) -> softmax [..., Tq, Tk]."""
    check_softmax(scores, mask, causal)
    check_float("scores", scores, KERNEL_DTYPES)
    check_launch(scores, mask)
    s4 = _as_4d(scores)
    n_batch, n_heads, n_queries, n_keys = s4.shape
    # Contiguous in the shape of scores: row r of the [B, H, Tq, Tk] view starts at r * Tk.
    y = torch.empty(scores.shape, dtype=scores.dtype, device=scores.device)
    kind = _NO_MASK if mask is None else _BOOL_MASK if mask.dtype == torch.bool else _ADDITIVE_MASK
    m4 = s4 if mask is None else _as_4d(mask.expand(scores.shape))
    block, single = row_block(n_keys, max_block)
    if y.numel() > 0:
        wrap_triton(_masked_softmax_fwd_kernel)[(n_batch * n_heads * n_queries,)](
            s4, m4, y, *s4.stride(), *m4.stride(), n_heads, n_queries, n_keys, scale,
            MASK=kind, CAUSAL=causal, BLOCK_N=block, SINGLE_BLOCK=single, num_warps=warps_for(block),
        )  # fmt: skip
    return y


def masked_softmax_backward(
    y: torch.Tensor, dy: torch.Tensor, scale: float, max_block: int = DEFAULT_MAX_BLOCK
) -> torch.Tensor:
    """y = the forward output, dy [..., Tq, Tk] -> d scores [..., Tq, Tk] (``scale`` times d logits)."""
    check_grad(dy, y, "y")
    check_launch(y, dy)
    y4 = _as_4d(y.contiguous())
    dy4 = _as_4d(dy)
    n_batch, n_heads, n_queries, n_keys = y4.shape
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    block, single = row_block(n_keys, max_block)
    if dx.numel() > 0:
        wrap_triton(_masked_softmax_bwd_kernel)[(n_batch * n_heads * n_queries,)](
            y4, dy4, dx, *dy4.stride(), n_heads, n_queries, n_keys, scale,
            BLOCK_N=block, SINGLE_BLOCK=single, num_warps=warps_for(block),
        )  # fmt: skip
    return dx


@triton_op("brickwork::masked_softmax_fwd", mutates_args={})
def _masked_softmax_fwd_op(
    scores: torch.Tensor, mask: torch.Tensor | None, scale: float, causal: bool, max_block: int
) -> torch.Tensor:
    return masked_softmax_forward(scores, mask, scale, causal, max_block)


@triton_op("brickwork::masked_softmax_bwd", mutates_args={})
def _masked_softmax_bwd_op(y: torch.Tensor, dy: torch.Tensor, scale: float, max_block: int) -> torch.Tensor:
    return masked_softmax_backward(y, dy, scale, max_block)


def _setup_context(ctx, inputs, output) -> None:
    _, mask, scale, _, max_block = inputs
    ctx.save_for_backward(output)
    ctx.scale = scale
    ctx.max_block = max_block
    ctx.mask_shape = None if mask is None else mask.shape


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    if not ctx.needs_input_grad[1]:
        return _masked_softmax_bwd_op(y, dy, ctx.scale, ctx.max_block), None, None, None, None
    # An additive mask that needs a gradient gets d logits summed over its broadcast dims.
    dlogits = _masked_softmax_bwd_op(y, dy, 1.0, ctx.max_block)
    return dlogits * ctx.scale, dlogits.sum_to_size(ctx.mask_shape), None, None, None


_masked_softmax_fwd_op.register_autograd(_backward, setup_context=_setup_context)


def masked_softmax_triton(
    scores: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float = 1.0,
    causal: bool = False,
    max_block: int = DEFAULT_MAX_BLOCK,
) -> torch.Tensor:
    """Differentiable Triton ``softmax(scores * scale + mask)`` over the last dim; see ``masked_softmax``.

    ``max_block`` caps the elements one program holds; rows wider than it take the online path.
    """
    return _masked_softmax_fwd_op(scores, mask, scale, causal, max_block)
