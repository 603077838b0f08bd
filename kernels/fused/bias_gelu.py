"""gelu(x + bias), optionally followed by dropout: Triton forward and backward kernels, launchers, autograd.

The work is cut into [BLOCK_M, BLOCK_N] tiles of the [M, N] row view of x (read through its strides).
Dropout draws its mask from Philox (``tl.randint``) keyed by the seed and counted by each element's
row-major index in x, so the backward pass regenerates the same mask instead of storing it, and the
torch twin (``brickwork.kernels.philox``) can rebuild it bit for bit. The bias gradient is a sum over
rows: each backward program owns up to 32 rows for one column block and writes one row of float32
partial sums, which torch adds up afterwards, so it is deterministic.

NaN and infinities give what the twin gives in float64: NaN stays NaN, ``gelu(+inf) = +inf``,
``gelu(-inf) = NaN`` (``-inf * 0``), and the slope at either infinity is NaN. (torch's vectorised
float32 CPU GELU returns NaN at ``+inf``, the only place where it disagrees with its float64 self.)
A dropped element is 0; its gradient is ``0 * slope``, which is NaN where ``x + bias`` is not finite
(the twin's ``where`` followed by GELU's backward gives the same).
"""

import functools

import torch
import triton
import triton.language as tl

from .._checks import check_dropout, check_gelu
from ..philox import dropout_threshold
from .launch import check_launch, check_max_block, device_programs, direct, partial_sums, sum_partials
from .op import TritonOp

# Elements per tile: enough work per program to hide memory latency, small enough to stay in registers.
DEFAULT_TILE = 4096
# The backward holds more per element (x, dy, the slope's terms), and runs best on half the forward's
# tile: on an H200 (bf16, 4096 rows) 2 x 1024 tiles took 159 us at width 16384 and 539 at 65536,
# where 4 x 1024 ones took 256 and 942.
BACKWARD_TILE = 2048
# Most rows one backward program covers; fewer where there are too few column blocks to fill the GPU
# (see _backward_rows_per_program).
ROWS_PER_PROGRAM = 32


@triton.jit
def _bias_gelu_fwd_kernel(
    x_ptr, bias_ptr, y_ptr, x_row_stride, x_col_stride, n_rows, n_cols, seed, keep_threshold, keep_scale,
    HAS_BIAS: tl.constexpr, TANH: tl.constexpr, DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    inside = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x_tile = x_ptr + rows[:, None] * x_row_stride + cols[None, :] * x_col_stride
    z = tl.load(x_tile, mask=inside, other=0.0).to(tl.float32)
    if HAS_BIAS:
        z = z + tl.load(bias_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)[None, :]
    if TANH:
        # 0.5 z (1 + tanh(u)), u = sqrt(2/pi) (z + 0.044715 z^3); tanh(|u|) = (1 - e) / (1 + e) with
        # e = exp(-2|u|) in (0, 1], which cannot overflow.
        inner = 0.7978845608028654 * (z + 0.044715 * z * z * z)
        e = tl.exp(-2.0 * tl.abs(inner))
        t = (1.0 - e) / (1.0 + e)
        y = 0.5 * z * (1.0 + tl.where(inner < 0.0, -t, t))
    else:
        y = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))
    if DROPOUT:
        bits = tl.randint(seed, rows[:, None] * n_cols + cols[None, :])
        y = tl.where((bits >> 1).to(tl.int32) >= keep_threshold, y * keep_scale, 0.0)
    tl.store(y_ptr + rows[:, None] * n_cols + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _bias_gelu_bwd_kernel(
    x_ptr, bias_ptr, dy_ptr, dx_ptr, dbias_ptr, x_row_stride, x_col_stride, dy_row_stride, dy_col_stride,
    n_rows, n_cols, rows_per_program, seed, keep_threshold, keep_scale,
    HAS_BIAS: tl.constexpr, TANH: tl.constexpr, DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols_inside = cols < n_cols
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=cols_inside, other=0.0).to(tl.float32)
    dbias = tl.zeros([BLOCK_N], dtype=tl.float32)
    first_row = pid_m * rows_per_program
    for start in range(first_row, tl.minimum(first_row + rows_per_program, n_rows), BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        inside = (rows[:, None] < n_rows) & cols_inside[None, :]
        x_tile = x_ptr + rows[:, None] * x_row_stride + cols[None, :] * x_col_stride
        z = tl.load(x_tile, mask=inside, other=0.0).to(tl.float32)
        if HAS_BIAS:
            z = z + bias[None, :]
        dy_tile = dy_ptr + rows[:, None] * dy_row_stride + cols[None, :] * dy_col_stride
        dy = tl.load(dy_tile, mask=inside, other=0.0).to(tl.float32)
        if TANH:
            # As in the forward; 1 - tanh(u)^2 = 4e / (1 + e)^2 avoids cancellation where tanh is near 1.
            inner = 0.7978845608028654 * (z + 0.044715 * z * z * z)
            e = tl.exp(-2.0 * tl.abs(inner))
            t = (1.0 - e) / (1.0 + e)
            sech2 = 4.0 * e / ((1.0 + e) * (1.0 + e))
            slope = 0.5 * (1.0 + tl.where(inner < 0.0, -t, t))
            slope += 0.5 * z * sech2 * 0.7978845608028654 * (1.0 + 0.134145 * z * z)
        else:
            # Phi(z) + z * phi(z), phi the standard normal density.
            slope = 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476))
            slope += z * 0.3989422804014327 * tl.exp(-0.5 * z * z)
        if DROPOUT:
            # The mask applies to dy before the slope, as in the twin: a dropped NaN slope gives NaN.
            bits = tl.randint(seed, rows[:, None] * n_cols + cols[None, :])
            dy = tl.where((bits >> 1).to(tl.int32) >= keep_threshold, dy * keep_scale, 0.0)
        dx = dy * slope
        # Out-of-range elements must add nothing, even where a non-finite bias makes their slope NaN.
        dx = tl.where(inside, dx, 0.0)
        dbias += tl.sum(dx, axis=0)
        tl.store(dx_ptr + rows[:, None] * n_cols + cols[None, :], dx.to(dx_ptr.dtype.element_ty), mask=inside)
    if HAS_BIAS:
        tl.store(dbias_ptr + pid_m * n_cols + cols, dbias, mask=cols_inside)


@functools.lru_cache(maxsize=1024)
def _tile(n_cols: int, max_tile: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, warps) for rows of ``n_cols`` and at most ``max_tile`` elements per tile."""
    block_n = min(triton.next_power_of_2(n_cols), 1024, max_tile)
    block_m = max(1, max_tile // block_n)
    return block_m, block_n, 4 if block_m * block_n <= 2048 else 8


def _backward_rows_per_program(n_rows: int, col_blocks: int, block_m: int, device: torch.device) -> int:
    """Rows each backward program sums the bias gradient over (whole tiles of ``block_m`` rows).

    At most ROWS_PER_PROGRAM, which keeps the float32 partial-sum buffer (one row per program, read
    once by torch) at 1/32 of the rows; fewer where the column blocks alone leave the GPU short of
    four programs per SM (narrow rows: at width 1024 there is one column block).
    """
    wanted_row_programs = triton.cdiv(device_programs(device, 4), col_blocks)
    rows = min(ROWS_PER_PROGRAM, triton.cdiv(n_rows, wanted_row_programs))
    return block_m * max(1, triton.cdiv(rows, block_m))


def bias_gelu_forward(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    approximate: str,
    p: float = 0.0,
    seed: int = 0,
    max_tile: int = DEFAULT_TILE,
    wrap=direct,
) -> torch.Tensor:
    """x [..., N], bias [N] or None -> dropout(gelu(x + bias), p) [..., N] in x's dtype; p = 0: no dropout.

    Takes inputs checked by :func:`bias_gelu_triton`. ``wrap`` wraps the kernel before launch.
    """
    x2 = x.reshape(-1, x.shape[-1])
    n_rows, n_cols = x2.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_m, block_n, warps = _tile(n_cols, max_tile)
    if n_rows > 0:
        grid = (triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n))
        wrap(_bias_gelu_fwd_kernel)[grid](
            x2, x2 if bias is None else bias, y, x2.stride(0), x2.stride(1), n_rows, n_cols,
            seed, dropout_threshold(p), 1.0 / (1.0 - p),
            HAS_BIAS=bias is not None, TANH=approximate == "tanh", DROPOUT=p > 0,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        )  # fmt: skip
    return y


def bias_gelu_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    bias: torch.Tensor | None,
    approximate: str,
    p: float = 0.0,
    seed: int = 0,
    max_tile: int = DEFAULT_TILE,
    wrap=direct,
) -> tuple[torch.Tensor, torch.Tensor]:
    """dy, x [..., N] -> (dx [..., N], dbias [N]); without a bias, dbias has shape [0]."""
    x2, dy2 = (t.reshape(-1, x.shape[-1]) for t in (x, dy))
    n_rows, n_cols = x2.shape
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_m, block_n, warps = _tile(n_cols, min(max_tile, BACKWARD_TILE))
    col_blocks = triton.cdiv(n_cols, block_n)
    rows_per_program = _backward_rows_per_program(n_rows, col_blocks, block_m, x.device)
    row_programs = triton.cdiv(n_rows, rows_per_program)
    dbias = partial_sums(bias, row_programs, n_cols, x.device)
    if n_rows > 0:
        wrap(_bias_gelu_bwd_kernel)[(row_programs, col_blocks)](
            x2, x2 if bias is None else bias, dy2, dx, dbias,
            x2.stride(0), x2.stride(1), dy2.stride(0), dy2.stride(1), n_rows, n_cols, rows_per_program,
            seed, dropout_threshold(p), 1.0 / (1.0 - p),
            HAS_BIAS=bias is not None, TANH=approximate == "tanh", DROPOUT=p > 0,
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        )  # fmt: skip
    return dx, sum_partials(dbias, bias)


def _setup_context(ctx, inputs, output) -> None:
    x, bias, approximate, p, seed, max_tile = inputs
    ctx.save_for_backward(x, bias)
    ctx.options = (approximate, p, seed, max_tile)


def _gradients(ctx, dy, backward):
    x, bias = ctx.saved_tensors
    dx, dbias = backward(dy, x, bias, *ctx.options)
    return dx, None if bias is None else dbias, None, None, None, None


_BIAS_GELU = TritonOp("bias_gelu", bias_gelu_forward, bias_gelu_backward, _setup_context, _gradients)


def bias_gelu_triton(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    approximate: str = "none",
    p: float = 0.0,
    seed: int = 0,
    max_tile: int = DEFAULT_TILE,
) -> torch.Tensor:
    """Differentiable Triton ``dropout(gelu(x + bias), p)``. x [..., N]; bias [N] or None -> [..., N].

    ``p = 0`` is plain bias-GELU. ``max_tile`` caps the elements per program tile (a power of two).
    Checks its inputs once; nothing below does. The way in (eager or compiled) is ``op.py``'s.
    """
    check_gelu(x, bias, approximate)
    check_dropout(p, seed)
    check_max_block(max_tile, "max_tile")
    check_launch("x", x)
    return _BIAS_GELU(x, bias, approximate, p, seed, max_tile)
