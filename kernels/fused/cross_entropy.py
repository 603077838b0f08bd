"""Cross-entropy over one chunk of logits, with its gradient written in place: Triton kernel and launcher.

This is the per-chunk step of :func:`brickwork.kernels.fused_linear_cross_entropy`. For each row of a
[C, V] logits chunk (any float dtype) it computes, in float32, ``loss = logsumexp(row) - row[label]``
with an online logsumexp (one pass keeps a running max and a running sum rescaled to it), and, when
asked, overwrites the row with d loss / d logits ``= softmax(row) - onehot(label)`` in the logits'
dtype. Rows whose label is ``ignore_index`` get loss 0 and a zero gradient. So the chunk's logits
buffer is reused for its gradient and no second [C, V] tensor exists. The torch twin is
:func:`brickwork.kernels.reference.cross_entropy_chunk_ref`.

A label outside [0, V) (which the entry point rejects for CPU tensors, but does not look for on a
GPU, where that would synchronise) gives a NaN loss and a NaN gradient row rather than a read out of
bounds. NaN or +inf among a row's logits makes its loss and its gradient NaN, as torch's
``cross_entropy`` does.
"""

import torch
import triton
import triton.language as tl

from .launch import row_launch

# Columns per step of the two passes over a row; vocabulary rows are far wider than this.
MAX_BLOCK = 4096


@triton.jit
def _cross_entropy_chunk_kernel(
    logits_ptr, labels_ptr, loss_ptr, row_stride, n_classes, row_width, ignore_index,
    COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * row_stride
    label = tl.load(labels_ptr + row).to(tl.int64)
    ignored = label == ignore_index
    in_range = (label >= 0) & (label < n_classes)
    row_max = float("-inf")
    total = 0.0
    for start in range(0, n_classes, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + cols, mask=cols < n_classes, other=float("-inf")).to(tl.float32)
        # tl.max skips NaN, but exp(NaN - max) makes the sum NaN, and the sum stays NaN.
        new_max = tl.maximum(row_max, tl.max(x, axis=0))
        total = total * tl.exp(row_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        row_max = new_max
    lse = row_max + tl.log(total)
    target = tl.load(row_ptr + tl.where(in_range, label, 0)).to(tl.float32)
    loss = tl.where(in_range, lse - target, float("nan"))
    tl.store(loss_ptr + row, tl.where(ignored, 0.0, loss))
    if COMPUTE_GRAD:
        # Padding columns past n_classes get a zero gradient, so they add nothing to the matmuls
        # that read the whole row back.
        for start in range(0, row_width, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            inside = cols < n_classes
            x = tl.load(row_ptr + cols, mask=inside, other=0.0).to(tl.float32)
            grad = tl.exp(x - lse) - tl.where(cols == label, 1.0, 0.0)
            grad = tl.where(in_range, grad, float("nan"))
            grad = tl.where(ignored | ~inside, 0.0, grad)
            tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=cols < row_width)


def cross_entropy_chunk_forward(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, compute_grad: bool, n_classes: int
) -> torch.Tensor:
    """logits [C, W] (rows contiguous), labels [C] -> float32 losses [C]; the gradient replaces logits.

    The first ``n_classes`` columns are the classes; any others are padding, which the gradient sets
    to 0. Takes inputs checked by ``fused_linear_cross_entropy``.
    """
    n_rows, row_width = logits.shape
    losses = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    launch = row_launch(n_classes, MAX_BLOCK)
    if n_rows > 0:
        _cross_entropy_chunk_kernel[(n_rows,)](
            logits, labels, losses, logits.stride(0), n_classes, row_width, ignore_index,
            COMPUTE_GRAD=compute_grad, BLOCK_V=launch.block, num_warps=launch.warps,
        )  # fmt: skip
    return losses
