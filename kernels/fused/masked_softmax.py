"""Fused scale + mask + softmax over the last dimension: Triton kernels, launchers, autograd.

Scores are viewed as [B, H, Tq, Tk] through their strides, and so is the mask after broadcasting (a
stride-0 view, never materialised), so a [B, 1, Tq, Tk] or [Tq, Tk] mask costs no extra memory. One
program handles one row. Logits are float32: ``scores * scale`` first, then the mask (bool: False
becomes -inf; float: added), then the bottom-right-aligned causal limit. A row that fits one block is
read once; wider rows use the online softmax (Milakov & Gimelshein, 2018): one pass keeps a running
max and a running sum rescaled to it, a second writes the output. A row with every logit at -inf gets
zeros, not 0/0. The backward pass reads the output y: ``dx = scale * y * (dy - sum(y * dy))``.

NaN and infinities give what the twin gives. ``tl.max`` skips NaN, so a row is never judged by its
max: the exponentials' sum is 0 exactly when every logit is -inf (the row is dead), is NaN when a
logit is NaN or +inf (``exp(inf - inf)``), and is at least 1 otherwise; a NaN sum makes the whole
row NaN. In the backward pass, positions hidden by a bool or causal mask get a zero gradient whatever
dy holds (the twin's ``masked_fill`` passes none back), and so does every position of a dead row
(recognised by y being zero throughout: a live row's largest y is at least 1 / Tk). Both only need
enforcing when ``sum(y * dy)`` is not finite, so only such rows read the mask in the backward pass.
"""

import torch
import triton
import triton.language as tl

from .._checks import check_softmax
from .launch import DEFAULT_MAX_BLOCK, check_launch, check_max_block, direct, row_launch
from .op import TritonOp

_NO_MASK, _BOOL_MASK, _ADDITIVE_MASK = 0, 1, 2


@triton.jit
def _hidden(
    m_row, cols, m_stride_k, n_keys, last_key, MASK: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    # Keys the bool mask or the causal limit take away (out-of-range columns count as hidden).
    hidden = cols >= n_keys
    if MASK == 1:
        hidden = hidden | (tl.load(m_row + cols * m_stride_k, mask=cols < n_keys, other=0) == 0)
    if CAUSAL:
        hidden = hidden | (cols > last_key)
    return hidden


@triton.jit
def _masked_logits(
    s_row, m_row, cols, s_stride_k, m_stride_k, n_keys, last_key, scale,
    MASK: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    logits = tl.load(s_row + cols * s_stride_k, mask=cols < n_keys, other=0.0).to(tl.float32) * scale
    if MASK == 2:
        logits += tl.load(m_row + cols * m_stride_k, mask=cols < n_keys, other=0.0).to(tl.float32)
    # where, not arithmetic: a NaN or +inf score under a hidden key must vanish, as masked_fill does.
    return tl.where(_hidden(m_row, cols, m_stride_k, n_keys, last_key, MASK, CAUSAL), float("-inf"), logits)


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
        # A dead row has max -inf; shifting by 0 instead makes every exp 0 and the sum 0.
        e = tl.exp(logits - tl.where(row_max == float("-inf"), 0.0, row_max))
        total = tl.sum(e, axis=0)
        # Only a dead row sums to 0 (its y is then 0 / 1); a NaN sum stays NaN.
        y = e / tl.where(total == 0.0, 1.0, total)
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
        inverse = 1.0 / tl.where(total == 0.0, 1.0, total)
        for start in range(0, n_keys, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            logits = _masked_logits(
                s_row, m_row, cols, s_stride_k, m_stride_k, n_keys, last_key, scale, MASK, CAUSAL
            )
            y = tl.exp(logits - shift) * inverse
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_keys)


@triton.jit
def _masked_softmax_bwd_kernel(
    y_ptr, dy_ptr, mask_ptr, dx_ptr, dy_stride_b, dy_stride_h, dy_stride_q, dy_stride_k,
    m_stride_b, m_stride_h, m_stride_q, m_stride_k, n_heads, n_queries, n_keys, scale,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    q = row % n_queries
    h = (row // n_queries) % n_heads
    b = row // (n_queries * n_heads)
    dy_row = dy_ptr + b * dy_stride_b + h * dy_stride_h + q * dy_stride_q
    m_row = mask_ptr + b * m_stride_b + h * m_stride_h + q * m_stride_q
    y_row = y_ptr + row * n_keys
    dx_row = dx_ptr + row * n_keys
    last_key = q + n_keys - n_queries
    # With a finite sum(y * dy) every hidden key (y = 0, and so finite dy there) already gets 0, and so
    # does a dead row; only a non-finite sum needs the mask read and the dead row recognised.
    if SINGLE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        inside = cols < n_keys
        y = tl.load(y_row + cols, mask=inside, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols * dy_stride_k, mask=inside, other=0.0).to(tl.float32)
        y_dot_dy = tl.sum(y * dy, axis=0)
        dx = scale * y * (dy - y_dot_dy)
        if (y_dot_dy != y_dot_dy) | (tl.abs(y_dot_dy) == float("inf")):
            dead = tl.sum((y != 0.0).to(tl.int32), axis=0) == 0
            hidden = _hidden(m_row, cols, m_stride_k, n_keys, last_key, MASK, CAUSAL)
            dx = tl.where(hidden | dead, 0.0, dx)
        tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)
    else:
        dot = tl.zeros([BLOCK_N], dtype=tl.float32)
        nonzero = tl.zeros([BLOCK_N], dtype=tl.int32)
        for start in range(0, n_keys, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            inside = cols < n_keys
            y = tl.load(y_row + cols, mask=inside, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * dy_stride_k, mask=inside, other=0.0).to(tl.float32)
            dot += y * dy
            nonzero += (y != 0.0).to(tl.int32)
        y_dot_dy = tl.sum(dot, axis=0)
        non_finite = (y_dot_dy != y_dot_dy) | (tl.abs(y_dot_dy) == float("inf"))
        dead = tl.sum(nonzero, axis=0) == 0
        for start in range(0, n_keys, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            inside = cols < n_keys
            y = tl.load(y_row + cols, mask=inside, other=0.0).to(tl.float32)
            dy = tl.load(dy_row + cols * dy_stride_k, mask=inside, other=0.0).to(tl.float32)
            dx = scale * y * (dy - y_dot_dy)
            if non_finite:
                hidden = _hidden(m_row, cols, m_stride_k, n_keys, last_key, MASK, CAUSAL)
                dx = tl.where(hidden | dead, 0.0, dx)
            tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    """[..., Tq, Tk] (or [Tk]) -> [B, H, Tq, Tk], a view unless three or more leading dims cannot merge."""
    if t.dim() <= 4:
        return t.view((1,) * (4 - t.dim()) + tuple(t.shape))
    return t.reshape(-1, *t.shape[-3:])


def _launch(
    kernel, inputs: tuple[torch.Tensor, ...], mask: torch.Tensor | None, out: torch.Tensor, scale: float,
    causal: bool, max_block: int,
) -> None:  # fmt: skip
    """Launch ``kernel`` with one program per row of ``out`` [..., Tq, Tk] (contiguous: row r of its
    [B, H, Tq, Tk] view starts at r * Tk). ``inputs`` are [B, H, Tq, Tk], the last one read through
    its strides; the mask is viewed as [B, H, Tq, Tk] with stride 0 where it broadcasts."""
    n_batch, n_heads, n_queries, n_keys = inputs[-1].shape
    if mask is None:
        kind, m4 = _NO_MASK, inputs[0]  # stands in for the pointer the kernel does not read
    else:
        kind = _BOOL_MASK if mask.dtype == torch.bool else _ADDITIVE_MASK
        m4 = _as_4d(mask.expand(out.shape))
    launch = row_launch(n_keys, max_block)
    if out.numel() > 0:
        kernel[(n_batch * n_heads * n_queries,)](
            *inputs, m4, out, *inputs[-1].stride(), *m4.stride(), n_heads, n_queries, n_keys, scale,
            MASK=kind, CAUSAL=causal, BLOCK_N=launch.block, SINGLE_BLOCK=launch.single,
            num_warps=launch.warps,
        )  # fmt: skip


def masked_softmax_forward(
    scores: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
    max_block: int = DEFAULT_MAX_BLOCK,
    wrap=direct,
) -> torch.Tensor:
    """scores [..., Tq, Tk], mask broadcastable to it (bool or float) -> softmax [..., Tq, Tk].

    Takes inputs checked by :func:`masked_softmax_triton`. ``wrap`` wraps the kernel before launch.
    """
    y = torch.empty(scores.shape, dtype=scores.dtype, device=scores.device)
    _launch(wrap(_masked_softmax_fwd_kernel), (_as_4d(scores),), mask, y, scale, causal, max_block)
    return y


def masked_softmax_backward(
    y: torch.Tensor,
    dy: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    causal: bool,
    max_block: int = DEFAULT_MAX_BLOCK,
    wrap=direct,
) -> torch.Tensor:
    """y = the forward output, dy [..., Tq, Tk] -> d scores [..., Tq, Tk] (``scale`` times d logits).

    ``mask`` and ``causal`` are the forward's: hidden keys get no gradient.
    """
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    inputs = (_as_4d(y.contiguous()), _as_4d(dy))
    _launch(wrap(_masked_softmax_bwd_kernel), inputs, mask, dx, scale, causal, max_block)
    return dx


def _setup_context(ctx, inputs, output) -> None:
    _, mask, scale, causal, max_block = inputs
    ctx.save_for_backward(output, mask)
    ctx.options = (scale, causal, max_block)


def _gradients(ctx, dy, backward):
    y, mask = ctx.saved_tensors
    scale, causal, max_block = ctx.options
    mask_grad = ctx.needs_input_grad[1]
    dlogits = backward(y, dy, mask, 1.0 if mask_grad else scale, causal, max_block)
    if not mask_grad:
        return dlogits, None, None, None, None
    # An additive mask that needs a gradient gets d logits summed over its broadcast dims.
    return dlogits * scale, dlogits.sum_to_size(mask.shape), None, None, None


_MASKED_SOFTMAX = TritonOp(
    "masked_softmax", masked_softmax_forward, masked_softmax_backward, _setup_context, _gradients
)


def masked_softmax_triton(
    scores: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float = 1.0,
    causal: bool = False,
    max_block: int = DEFAULT_MAX_BLOCK,
) -> torch.Tensor:
    """Differentiable Triton ``softmax(scores * scale + mask)`` over the last dim; see ``masked_softmax``.

    ``max_block`` caps the elements one program holds; rows wider than it take the online path.
    Checks its inputs once; nothing below does. The way in (eager or compiled) is ``op.py``'s.
    """
    check_softmax(scores, mask, causal)
    check_max_block(max_block)
    check_launch("scores", scores)
    return _MASKED_SOFTMAX(scores, mask, scale, causal, max_block)
