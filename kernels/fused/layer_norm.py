"""LayerNorm over the last dimension: Triton forward and backward kernels, launchers, autograd.

Rows are read through their strides, so a non-contiguous input costs no copy when its leading dims
collapse to one row stride. Statistics are float32 whatever the input dtype. A row that fits one block
(``BLOCK_N <= max_block``, and at most ``BACKWARD_MAX_BLOCK`` in the backward) is read once; wider
rows are walked in chunks: the forward merges each chunk's mean and squared deviations into running
ones (Chan et al.'s pairwise update) and then writes; the backward first takes each row's two sums,
then walks one column chunk at a time over its rows, writing dx and summing the parameter gradients
of that chunk in registers.

The weight and bias gradients are sums over rows. Each backward program owns a contiguous range of
rows and one row of a float32 partial-sum buffer, which it stores once (never reads back); torch
adds the buffer's rows afterwards. No atomics, so the result is bit-for-bit reproducible.

The row statistics use correctly rounded division and square root (``tl.div_rn``, ``tl.sqrt_rn``):
the default ones are approximate on GPUs, and at width 1 an inexact ``x / 1`` leaves ``x - mean``
a rounding error away from zero, which ``rstd = 1 / sqrt(eps)`` then magnifies. With them, and with
``w * dy`` kept from being fused into the subtraction that uses it (an FMA would subtract its
unrounded value from the rounded sum), a width-1 row gives ``y = bias`` and ``dx = 0`` exactly, as
the twin does. NaN and infinities propagate as in the twin: a non-finite x makes its row's
statistics, and so the row, NaN; a non-finite dy makes the backward's row sums non-finite, and then
its whole dx row is NaN.
"""

import torch
import triton
import triton.language as tl

from .._checks import check_norm
from .launch import (
    DEFAULT_MAX_BLOCK,
    check_launch,
    check_max_block,
    direct,
    partial_sums,
    reduction_programs,
    row_launch,
    sum_partials,
)
from .op import TritonOp

# The one-block backward holds w, both parameter-gradient rows, x, dy and x-hat for a whole row: above
# 8192 columns that exceeds the registers and spills (on sm_90, 752 bytes of stack per thread at 16384,
# 168 at 8192), so wider rows take the looped path.
BACKWARD_MAX_BLOCK = 8192


@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr, weight_ptr, bias_ptr, y_ptr, mean_ptr, rstd_ptr,
    x_row_stride, x_col_stride, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * n_cols
    if SINGLE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        inside = cols < n_cols
        x = tl.load(x_row + cols * x_col_stride, mask=inside, other=0.0).to(tl.float32)
        mean = tl.div_rn(tl.sum(x, axis=0), n_cols * 1.0)
        centred = tl.where(inside, x - mean, 0.0)
        rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(centred * centred, axis=0), n_cols * 1.0) + eps))
        y = centred * rstd
        if HAS_WEIGHT:
            y = y * tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        if HAS_BIAS:
            y = y + tl.load(bias_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=inside)
    else:
        mean = 0.0
        m2 = 0.0
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            inside = cols < n_cols
            x = tl.load(x_row + cols * x_col_stride, mask=inside, other=0.0).to(tl.float32)
            count = tl.minimum(n_cols - start, BLOCK_N).to(tl.float32)
            chunk_mean = tl.div_rn(tl.sum(x, axis=0), count)
            deviation = tl.where(inside, x - chunk_mean, 0.0)
            seen = start * 1.0
            delta = chunk_mean - mean
            mean = mean + delta * (count / (seen + count))
            m2 = m2 + tl.sum(deviation * deviation, axis=0) + delta * delta * (seen * count / (seen + count))
        rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(m2, n_cols * 1.0) + eps))
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            inside = cols < n_cols
            x = tl.load(x_row + cols * x_col_stride, mask=inside, other=0.0).to(tl.float32)
            y = (x - mean) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
            if HAS_BIAS:
                y = y + tl.load(bias_ptr + cols, mask=inside, other=0.0).to(tl.float32)
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=inside)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _layer_norm_bwd_kernel(
    x_ptr, weight_ptr, dy_ptr, dx_ptr, mean_ptr, rstd_ptr, dweight_ptr, dbias_ptr, row_sums_ptr,
    x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, n_rows, n_cols, rows_per_program,
    HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
):  # fmt: skip
    # dx = rstd * (w*dy - mean(w*dy) - xhat * mean(w*dy * xhat)), means taken over the row.
    pid = tl.program_id(0).to(tl.int64)
    first_row = pid * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, n_rows)
    partial_row = pid * n_cols
    if not SINGLE_BLOCK:
        # Pass 1, row by row: each row's two sums, kept in row_sums [2, n_rows].
        for row in range(first_row, last_row):
            mean = tl.load(mean_ptr + row)
            rstd = tl.load(rstd_ptr + row)
            sum_xhat_wdy = tl.zeros([BLOCK_N], dtype=tl.float32)
            sum_wdy = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                inside = cols < n_cols
                x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=inside, other=0.0)
                dy = tl.load(dy_ptr + row * dy_row_stride + cols * dy_col_stride, mask=inside, other=0.0)
                dy = dy.to(tl.float32)
                xhat = tl.where(inside, (x.to(tl.float32) - mean) * rstd, 0.0)
                if HAS_WEIGHT:
                    w = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
                    dy = tl.fma(dy, w, 0.0)  # rounded as in pass 2
                sum_xhat_wdy += xhat * dy
                sum_wdy += dy
            tl.store(row_sums_ptr + row, tl.div_rn(tl.sum(sum_xhat_wdy, axis=0), n_cols * 1.0))
            tl.store(row_sums_ptr + n_rows + row, tl.div_rn(tl.sum(sum_wdy, axis=0), n_cols * 1.0))
        # The sums stored above are read below by other threads of this program.
        tl.debug_barrier()
    # One column chunk at a time (a single one for a one-block row) over this program's rows: dx, and
    # the parameter gradients summed in registers and stored once per chunk (no read-add-write of
    # partial rows). A one-block row takes its two sums here, from the row it holds.
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inside = cols < n_cols
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        dweight = tl.zeros([BLOCK_N], dtype=tl.float32)
        dbias = tl.zeros([BLOCK_N], dtype=tl.float32)
        for row in range(first_row, last_row):
            x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=inside, other=0.0)
            dy = tl.load(dy_ptr + row * dy_row_stride + cols * dy_col_stride, mask=inside, other=0.0)
            dy = dy.to(tl.float32)
            rstd = tl.load(rstd_ptr + row)
            xhat = tl.where(inside, (x.to(tl.float32) - tl.load(mean_ptr + row)) * rstd, 0.0)
            # w*dy as an explicit FMA with +0 is one rounded value the compiler cannot fold: as a plain
            # product it would be fused into the subtraction below (an FMA), differ from the summed one
            # by a rounding, and rstd would magnify that (width 1 must give 0).
            wdy = tl.fma(dy, w, 0.0) if HAS_WEIGHT else dy
            if SINGLE_BLOCK:
                c1 = tl.div_rn(tl.sum(xhat * wdy, axis=0), n_cols * 1.0)
                c2 = tl.div_rn(tl.sum(wdy, axis=0), n_cols * 1.0)
            else:
                c1 = tl.load(row_sums_ptr + row)
                c2 = tl.load(row_sums_ptr + n_rows + row)
            # A non-finite row reduction makes the whole row NaN, as in the twin (0 * inf is NaN).
            dx = (wdy - (xhat * c1 + c2)) * rstd + (c1 + c2) * 0.0
            tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)
            if HAS_WEIGHT:
                dweight += dy * xhat
            if HAS_BIAS:
                dbias += dy
        if HAS_WEIGHT:
            tl.store(dweight_ptr + partial_row + cols, dweight, mask=inside)
        if HAS_BIAS:
            tl.store(dbias_ptr + partial_row + cols, dbias, mask=inside)


def layer_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    max_block: int = DEFAULT_MAX_BLOCK,
    wrap=direct,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [..., N] -> (y [..., N] in x's dtype, mean [M], rstd [M] in float32), M the number of rows.

    Takes inputs checked by :func:`layer_norm_triton`. ``wrap`` wraps the kernel before launch.
    """
    x2 = x.reshape(-1, x.shape[-1])
    n_rows, n_cols = x2.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    mean = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    launch = row_launch(n_cols, max_block)
    if n_rows > 0:
        wrap(_layer_norm_fwd_kernel)[(n_rows,)](
            x2, x2 if weight is None else weight, x2 if bias is None else bias, y, mean, rstd,
            x2.stride(0), x2.stride(1), n_cols, eps,
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_N=launch.block,
            SINGLE_BLOCK=launch.single, num_warps=launch.warps,
        )  # fmt: skip
    return y, mean, rstd


def layer_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    bias: torch.Tensor | None,
    max_block: int = DEFAULT_MAX_BLOCK,
    wrap=direct,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dy, x [..., N] -> (dx [..., N], dweight [N], dbias [N]); a missing weight or bias gives shape [0]."""
    x2, dy2 = (t.reshape(-1, x.shape[-1]) for t in (x, dy))
    n_rows, n_cols = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    programs = reduction_programs(x.device, n_rows, n_cols)
    launch = row_launch(n_cols, min(max_block, BACKWARD_MAX_BLOCK))
    dweight = partial_sums(weight, programs, n_cols, x.device)
    dbias = partial_sums(bias, programs, n_cols, x.device)
    # The looped path keeps each row's two sums between its passes.
    row_sums = mean if launch.single else torch.empty(2 * n_rows, dtype=torch.float32, device=x.device)
    if n_rows > 0:
        wrap(_layer_norm_bwd_kernel)[(programs,)](
            x2, x2 if weight is None else weight, dy2, dx, mean, rstd, dweight, dbias, row_sums,
            x2.stride(0), x2.stride(1), dy2.stride(0), dy2.stride(1), n_rows, n_cols,
            triton.cdiv(n_rows, programs),
            HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None, BLOCK_N=launch.block,
            SINGLE_BLOCK=launch.single, num_warps=launch.warps,
        )  # fmt: skip
    return dx, sum_partials(dweight, weight), sum_partials(dbias, bias)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias, _, max_block = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, bias, mean, rstd)
    ctx.max_block = max_block


def _gradients(ctx, dy, backward):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    dx, dweight, dbias = backward(dy, x, weight, mean, rstd, bias, ctx.max_block)
    return dx, None if weight is None else dweight, None if bias is None else dbias, None, None


_LAYER_NORM = TritonOp("layer_norm", layer_norm_forward, layer_norm_backward, _setup_context, _gradients)


def layer_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    max_block: int = DEFAULT_MAX_BLOCK,
) -> torch.Tensor:
    """Differentiable Triton LayerNorm. x [..., N]; weight, bias [N] or None -> [..., N].

    ``max_block`` caps the elements one program holds; rows wider than it take the looped path.
    Checks its inputs once; nothing below does. The way in (eager or compiled) is ``op.py``'s.
    """
    check_norm(x, weight, bias, eps)
    check_max_block(max_block)
    check_launch("x", x)
    return _LAYER_NORM(x, weight, bias, eps, max_block)
