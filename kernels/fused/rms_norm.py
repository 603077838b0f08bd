"""RMSNorm over the last dimension: Triton forward and backward kernels, launchers, autograd.

``y = x * rstd * weight`` with ``rstd = 1 / sqrt(mean(x**2) + eps)`` in float32. The layout follows
``layer_norm.py``: strided rows, one block per row when it fits and a looped path beyond (two
passes in the backward: row sums, then column chunks), and a deterministic weight gradient from
per-program partial sums that torch adds up afterwards.

As in ``layer_norm.py``, ``rstd`` and the row mean use correctly rounded division and square root.
At width 1, ``dx = w dy rstd (1 - xhat**2)`` cancels almost completely, so that case uses the exact
identity ``1 - xhat**2 = eps rstd**2`` instead. NaN and infinities propagate as in the twin.
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


@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr, weight_ptr, y_ptr, rstd_ptr, x_row_stride, x_col_stride, n_cols, eps,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * n_cols
    if SINGLE_BLOCK:
        cols = tl.arange(0, BLOCK_N)
        inside = cols < n_cols
        x = tl.load(x_row + cols * x_col_stride, mask=inside, other=0.0).to(tl.float32)
        rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(x * x, axis=0), n_cols * 1.0) + eps))
        y = x * rstd
        if HAS_WEIGHT:
            y = y * tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=inside)
    else:
        squares = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            x = tl.load(x_row + cols * x_col_stride, mask=cols < n_cols, other=0.0).to(tl.float32)
            squares += x * x
        rstd = tl.div_rn(1.0, tl.sqrt_rn(tl.div_rn(tl.sum(squares, axis=0), n_cols * 1.0) + eps))
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            inside = cols < n_cols
            y = tl.load(x_row + cols * x_col_stride, mask=inside, other=0.0).to(tl.float32) * rstd
            if HAS_WEIGHT:
                y = y * tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=inside)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rms_norm_bwd_kernel(
    x_ptr, weight_ptr, dy_ptr, dx_ptr, rstd_ptr, dweight_ptr, row_sums_ptr,
    x_row_stride, x_col_stride, dy_row_stride, dy_col_stride, n_rows, n_cols, rows_per_program, eps,
    HAS_WEIGHT: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_BLOCK: tl.constexpr,
):  # fmt: skip
    # dx = rstd * (w*dy - xhat * mean(w*dy * xhat)), xhat = x * rstd, the mean taken over the row.
    pid = tl.program_id(0).to(tl.int64)
    first_row = pid * rows_per_program
    last_row = tl.minimum(first_row + rows_per_program, n_rows)
    partial_row = pid * n_cols
    if not SINGLE_BLOCK:
        # Pass 1, row by row: each row's sum, kept in row_sums [n_rows].
        for row in range(first_row, last_row):
            rstd = tl.load(rstd_ptr + row)
            sum_xhat_wdy = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                cols = start + tl.arange(0, BLOCK_N)
                inside = cols < n_cols
                x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=inside, other=0.0)
                dy = tl.load(dy_ptr + row * dy_row_stride + cols * dy_col_stride, mask=inside, other=0.0)
                wdy = dy.to(tl.float32)
                if HAS_WEIGHT:
                    wdy = wdy * tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
                sum_xhat_wdy += x.to(tl.float32) * rstd * wdy
            tl.store(row_sums_ptr + row, tl.div_rn(tl.sum(sum_xhat_wdy, axis=0), n_cols * 1.0))
        # The sums stored above are read below by other threads of this program.
        tl.debug_barrier()
    # One column chunk at a time (a single one for a one-block row) over this program's rows: dx, and
    # the weight gradient summed in registers and stored once per chunk (no read-add-write of partial
    # rows). A one-block row takes its sum here, from the row it holds.
    for start in range(0, n_cols, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        inside = cols < n_cols
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        dweight = tl.zeros([BLOCK_N], dtype=tl.float32)
        for row in range(first_row, last_row):
            x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=inside, other=0.0)
            dy = tl.load(dy_ptr + row * dy_row_stride + cols * dy_col_stride, mask=inside, other=0.0)
            dy = dy.to(tl.float32)
            rstd = tl.load(rstd_ptr + row)
            xhat = x.to(tl.float32) * rstd
            if HAS_WEIGHT:
                wdy = dy * w
                dweight += dy * xhat
            else:
                wdy = dy
            if SINGLE_BLOCK:
                c1 = tl.div_rn(tl.sum(xhat * wdy, axis=0), n_cols * 1.0)
                # At width 1, 1 - xhat**2 is eps * rstd**2 exactly: no cancellation. Adding (xhat + c1)
                # * 0 keeps the NaN that a non-finite x or dy gives the general formula.
                exact = wdy * (eps * rstd * rstd) + (xhat + c1) * 0.0
                dx = tl.where(n_cols == 1, exact, wdy - xhat * c1) * rstd
            else:
                dx = (wdy - xhat * tl.load(row_sums_ptr + row)) * rstd
            tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)
        if HAS_WEIGHT:
            tl.store(dweight_ptr + partial_row + cols, dweight, mask=inside)


def rms_norm_forward(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, max_block: int = DEFAULT_MAX_BLOCK, wrap=direct
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., N] -> (y [..., N] in x's dtype, rstd [M] in float32), M the number of rows.

    Takes inputs checked by :func:`rms_norm_triton`. ``wrap`` wraps the kernel before launch.
    """
    x2 = x.reshape(-1, x.shape[-1])
    n_rows, n_cols = x2.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    launch = row_launch(n_cols, max_block)
    if n_rows > 0:
        wrap(_rms_norm_fwd_kernel)[(n_rows,)](
            x2, x2 if weight is None else weight, y, rstd, x2.stride(0), x2.stride(1), n_cols, eps,
            HAS_WEIGHT=weight is not None, BLOCK_N=launch.block, SINGLE_BLOCK=launch.single,
            num_warps=launch.warps,
        )  # fmt: skip
    return y, rstd


def rms_norm_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    eps: float,
    max_block: int = DEFAULT_MAX_BLOCK,
    wrap=direct,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dy, x [..., N] -> (dx [..., N], dweight [N]); without a weight, dweight has shape [0]."""
    x2, dy2 = (t.reshape(-1, x.shape[-1]) for t in (x, dy))
    n_rows, n_cols = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    programs = reduction_programs(x.device, n_rows, n_cols)
    launch = row_launch(n_cols, max_block)
    dweight = partial_sums(weight, programs, n_cols, x.device)
    # The looped path keeps each row's sum between its passes.
    row_sums = rstd if launch.single else torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows > 0:
        wrap(_rms_norm_bwd_kernel)[(programs,)](
            x2, x2 if weight is None else weight, dy2, dx, rstd, dweight, row_sums,
            x2.stride(0), x2.stride(1), dy2.stride(0), dy2.stride(1), n_rows, n_cols,
            triton.cdiv(n_rows, programs), eps,
            HAS_WEIGHT=weight is not None, BLOCK_N=launch.block, SINGLE_BLOCK=launch.single,
            num_warps=launch.warps,
        )  # fmt: skip
    return dx, sum_partials(dweight, weight)


def _setup_context(ctx, inputs, output) -> None:
    x, weight, eps, max_block = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.options = (eps, max_block)


def _gradients(ctx, dy, backward):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = backward(dy, x, weight, rstd, *ctx.options)
    return dx, None if weight is None else dweight, None, None


_RMS_NORM = TritonOp("rms_norm", rms_norm_forward, rms_norm_backward, _setup_context, _gradients)


def rms_norm_triton(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, max_block: int = DEFAULT_MAX_BLOCK
) -> torch.Tensor:
    """Differentiable Triton RMSNorm. x [..., N]; weight [N] or None -> [..., N].

    ``max_block`` caps the elements one program holds; rows wider than it take the looped path.
    Checks its inputs once; nothing below does. The way in (eager or compiled) is ``op.py``'s.
    """
    check_norm(x, weight, None, eps)
    check_max_block(max_block)
    check_launch("x", x)
    return _RMS_NORM(x, weight, eps, max_block)
