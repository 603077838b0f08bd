"""A bank of experts run as one grouped GEMM per projection (``torch.nn.functional.grouped_mm``).

The loop of :class:`~brickwork.components.feedforward.moe.Experts` runs one small matmul per expert
and projection, and first copies the row counts to the host to split the rows. ``grouped_mm`` runs a
projection of every expert as one kernel that reads each expert's rows between offsets kept on the
device, forward and backward (its derivative is torch's own).

Which experts: :class:`~.mlp.MLP` and :class:`~.glu.GLU` (so SwiGLU and GeGLU), with their own
forward (linear -> elementwise activation, gated or not -> dropout -> linear), all of one class, one
activation and one dropout, on plain weights (no tensor-parallel shards, no hooks on the projections).
Any other bank, e.g. one of ConvMLPs or of a subclass with its own forward, keeps the loop.

When: torch's fast kernel (CUTLASS) serves bf16 on CUDA devices of compute capability 9.x and 10.x;
elsewhere on CUDA torch falls back to a loop of matmuls after copying the offsets to the host, which
gains nothing over the bank's loop. ``Experts.grouped``: ``None`` (the default) groups only bias-free
experts, and only where the fast kernel runs; ``True`` groups wherever torch's kernel accepts the
input (on CPU fp32, bf16 and fp16); ``False`` never. Biased experts loop under ``None`` because on one
H200 (torch 2.11, bf16, 8192 tokens, dim 1024, hidden 2816, 8 swiglu experts, top-2) the grouped bank
took 1.49 / 1.23 ms forward / backward against the loop's 2.06 / 2.10 without biases, but 1.88 / 8.30
against 2.23 / 4.11 with them, its backward then spent on the scatter-add that indexing the stacked
biases by row differentiates to (measured before :class:`ExpertBias` replaced it with a per-expert
sum). The kernel also needs 16-byte aligned rows and strides: ``dim_model`` and the hidden width
multiples of 16 bytes' worth of elements (8 in bf16). Under autocast the rows and weights are cast to
autocast's dtype first, as autocast casts a linear's.

The weights are stacked at call time into ``[E, out, in]``, so each expert keeps its own parameters
and the state-dict keys stay those of the loop; the stack costs one copy of the bank's weights per
forward, and backward splits its gradient back onto each expert (zeros for an expert with no rows).
Dropout draws one mask over all rows instead of one per expert: the same distribution, other draws.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .glu import GLU
from .mlp import MLP, runs_plain

GROUPED_FORWARDS = (MLP.forward, GLU.forward)
# Input dtypes torch's grouped_mm takes on each device; on CUDA, bf16 only.
KERNEL_DTYPES = {"cpu": (torch.float32, torch.bfloat16, torch.float16), "cuda": (torch.bfloat16,)}


def groupable(experts: Sequence[nn.Module]) -> bool:
    """Whether ``experts`` are all the same plain MLP or GLU (see the module docstring)."""
    if (
        not experts
        or len({type(e) for e in experts}) != 1
        or type(experts[0]).forward not in GROUPED_FORWARDS
    ):
        return False
    first = experts[0]
    # repr names the activation and its settings (SmeLU's beta, a wrapped function's name).
    same = all(
        repr(e.activation) == repr(first.activation) and e.dropout.p == first.dropout.p for e in experts
    )
    shapes = {
        (n, *getattr(e, n).weight.shape, getattr(e, n).bias is None) for e in experts for n in e.projections()
    }
    plain = all(runs_plain(getattr(e, name)) for e in experts for name in e.projections())
    return same and plain and len(shapes) == len(first.projections())


def compute_dtype(rows: torch.Tensor) -> torch.dtype:
    """The dtype the projections run in: autocast's where it is on for the rows' device."""
    device = rows.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else rows.dtype


def fast_grouped_kernel(rows: torch.Tensor) -> bool:
    """Whether torch's fast grouped kernel serves ``rows``' device: CUDA of capability 9.x or 10.x."""
    # ROCm reports its own architecture numbers as capabilities: only CUDA's 9.x and 10.x have the kernel.
    return (
        rows.is_cuda and not torch.version.hip and torch.cuda.get_device_capability(rows.device)[0] in (9, 10)
    )


def has_biases(experts: Sequence[nn.Module]) -> bool:
    """Whether the projections of a :func:`groupable` bank carry biases (all of them or none do)."""
    return any(getattr(experts[0], name).bias is not None for name in experts[0].projections())


def use_grouped_mm(experts: Sequence[nn.Module], rows: torch.Tensor, grouped: bool | None) -> bool:
    """Whether :func:`grouped_experts_forward` runs ``experts`` on ``rows`` ``[M, d]`` (``grouped``: the
    bank's setting, see the module docstring)."""
    if grouped is False or rows.dim() != 2 or not groupable(experts):
        return False
    dtype = compute_dtype(rows)
    if dtype not in KERNEL_DTYPES.get(rows.device.type, ()):
        return False
    if grouped is None and (has_biases(experts) or not fast_grouped_kernel(rows)):
        return False
    per_16_bytes = 16 // dtype.itemsize
    widths = {w for name in experts[0].projections() for w in getattr(experts[0], name).weight.shape}
    rows_aligned = rows.is_contiguous() and rows.data_ptr() % 16 == 0
    return rows_aligned and all(w % per_16_bytes == 0 for w in widths)


class DenseGradient(torch.autograd.Function):
    """The identity, whose backward hands on a dense gradient: grouped_mm's backward refuses one with
    zero strides, such as ``out.sum().backward()`` sends."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class ExpertBias(torch.autograd.Function):
    """out ``[M, n]`` plus the bias ``[E, n]`` of each row's expert (``expert_of_row`` ``[M]``, rows
    grouped by expert). Its backward sums each expert's rows of the gradient as one GEMM instead of
    the scatter-add of ``M`` rows onto ``E`` that indexing the bias would differentiate to."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        out: torch.Tensor,
        bias: torch.Tensor,
        expert_of_row: torch.Tensor,
    ) -> torch.Tensor:
        ctx.save_for_backward(expert_of_row)
        ctx.num_experts = bias.shape[0]
        return out + bias.index_select(0, expert_of_row)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        if not ctx.needs_input_grad[1]:
            return grad, None, None
        (expert_of_row,) = ctx.saved_tensors
        experts = torch.arange(ctx.num_experts, device=grad.device)
        # A one-hot [E, M] @ [M, n] GEMM: its products are exact (each gradient times 1 or 0), its
        # sums accumulate in fp32 for bf16 on CPU and in cuBLAS, and it needs no atomics. The
        # obvious alternative, torch.segment_reduce, sums in the input's dtype (bf16 here) in its
        # CUDA kernel for 2-D data, one thread per output element looping over the segment's rows.
        one_hot = (expert_of_row == experts[:, None]).to(grad.dtype)
        return grad, one_hot @ grad, None


def grouped_experts_forward(
    experts: Sequence[nn.Module], rows: torch.Tensor, counts: torch.Tensor
) -> torch.Tensor:
    """rows ``[M, d]`` grouped by expert, counts ``[E]`` rows per expert -> ``[M, d]``, each expert
    applied to its rows, every projection one grouped GEMM. Call only where :func:`use_grouped_mm`."""
    dtype = compute_dtype(rows)
    offsets = counts.cumsum(0).to(torch.int32)  # the end of each expert's rows
    expert_of_row = torch.repeat_interleave(
        torch.arange(len(experts), device=rows.device), counts, output_size=rows.shape[0]
    )

    def project(name: str, x: torch.Tensor) -> torch.Tensor:
        linears = [getattr(expert, name) for expert in experts]
        weight = torch.stack([linear.weight for linear in linears]).to(dtype)  # [E, out, in]
        # mat_b [E, in, out] column-major: the transposed view of the nn.Linear layout.
        out = DenseGradient.apply(F.grouped_mm(x, weight.transpose(1, 2), offs=offsets))
        if linears[0].bias is None:
            return out
        bias = torch.stack([linear.bias for linear in linears]).to(dtype)  # [E, out]
        return ExpertBias.apply(out, bias, expert_of_row)

    first = experts[0]
    x = rows.to(dtype)
    if isinstance(first, GLU):
        hidden = first.activation(project("gate_proj", x)) * project("up_proj", x)
    else:
        hidden = first.activation(project("up_proj", x))
    return project("down_proj", first.dropout(hidden) if first.dropout.p else hidden)
