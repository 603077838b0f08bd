"""Fused linear + cross-entropy for a language-model head, chunked over tokens.

``loss = cross_entropy(hidden @ weight.T + bias, labels)`` without ever holding the [N, V] logits:
tokens are taken ``chunk_size`` at a time; for each chunk the logits [C, V] are computed in the
weight's dtype (as an unfused head computes them), the chunk step turns them in place into
d loss / d logits while computing the float32 losses, and the gradients of hidden, weight and bias
are accumulated from that chunk at once. So the forward pass already holds every gradient, and the
backward pass only scales them by the incoming gradient of the loss. Peak extra memory is one chunk of
logits plus the gradients, instead of [N, V] logits, their float32 copy and the gradient of that copy.

The chunk step is the Triton kernel (``brickwork.kernels.fused.cross_entropy``) or its torch twin
(``reference.cross_entropy_chunk_ref``); the matmuls are torch's. The weight gradient accumulates in
float32 across chunks whatever the weight's dtype, and is rounded once at the end. For bf16 and fp16
weights on CUDA, where this torch build's ``addmm`` takes ``out_dtype``, each chunk's product is added
into that float32 gradient by the matmul itself; elsewhere it is computed in the weight's dtype and
converted before the addition.

On CUDA a vocabulary V that is not a multiple of ``VOCAB_ALIGNMENT`` is padded (:func:`pads_vocabulary`):
the loop works on a copy of the weight (and bias) with zero rows up to the next multiple, so that every
matmul's leading dimension is aligned, and the gradients' padding rows are dropped at the end. The
copy costs one more weight in memory while the forward pass runs (77 MB for GPT-2's bf16 head).

While ``torch.compile`` traces it, the loss is instead a sum of checkpointed chunks
(:func:`checkpointed_chunks`): each chunk's logits and float32 loss are plain torch ops that Inductor
fuses, kept for no longer than the chunk, and recomputed in the backward pass. The function above,
which computes gradients in its forward pass and writes into buffers in place, came out of
``torch.compile`` on CUDA with wrong gradients (torch 2.11, Triton and torch chunk steps alike).

The torch path does not chunk logits that fit one chunk (:func:`linear_cross_entropy_torch`).

A model whose head holds padding rows of its own (its ``vocab_multiple``, brickwork/layout/vocab_padding.py)
passes its real vocabulary as ``vocab_size``: the weight's rows from there on are padding, and every
path scores the first ``vocab_size`` columns only, as the chunk step does with the CUDA alignment
padding. Padding rows get zero gradient.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from brickwork.errors import ConfigError

from ._checks import check_float
from .reference import _compute_dtype, cross_entropy_chunk_ref

REDUCTIONS = ("mean", "sum")

ChunkStep = Callable[[torch.Tensor, torch.Tensor, int, bool, int], torch.Tensor]


# Float32 bytes of logits one chunk may hold by default: small against the [N, V] logits of a real
# batch (1.6 GB for 8 x 1024 tokens of GPT-2's vocabulary), yet a thousand tokens per matmul. Each
# chunk costs a few launches and three matmuls that must fill the GPU: on an H200, GPT-2's head over
# 8192 tokens took 9.4 ms in chunks of 256 tokens, 6.8 in chunks of 512 and 4.9 in chunks of 2048.
CHUNK_LOGITS_BYTES = 256 * 2**20


# Every matmul of the chunk loop has the vocabulary as a leading dimension (the [C, V] logits, their
# transpose for the weight gradient), and cuBLAS keeps its fast tensor-core kernels for leading
# dimensions aligned to 16 bytes at least: an odd vocabulary such as GPT-2's 50257 rules them out.
# 64 elements (128 bytes in bf16) starts every row on a cache line, for at most 63 padding rows.
VOCAB_ALIGNMENT = 64


def pads_vocabulary(weight: torch.Tensor) -> bool:
    """Whether the chunk loop pads the vocabulary of ``weight`` [V, D] to a multiple of ``VOCAB_ALIGNMENT``.

    On CUDA only, where cuBLAS picks its kernels by alignment; the CPU path keeps the unpadded loop
    and spares the weight copy.
    """
    return weight.is_cuda and weight.shape[0] % VOCAB_ALIGNMENT != 0


@functools.cache
def addmm_accumulates_in_float32(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)`` runs for ``dtype`` matrices
    a, b and a float32 ``acc`` on ``device``: one matmul adding a low-precision product into a float32
    sum. Tried once per device and dtype, since whether it runs depends on the build, not the version
    alone: the ``out_dtype`` overload has no CPU kernel, and older CUDA ones refuse a float32 ``acc``.
    """
    acc = torch.zeros(1, 1, device=device)
    mat = torch.ones(1, 1, dtype=dtype, device=device)
    try:
        torch.addmm(acc, mat, mat, out_dtype=torch.float32, out=acc)
    except (TypeError, RuntimeError):  # no such overload; no kernel here (NotImplementedError); refused
        return False
    return acc.item() == 1.0


def default_chunk_size(n_tokens: int, vocab_size: int) -> int:
    """Tokens per chunk: the largest power of two whose float32 logits fit ``CHUNK_LOGITS_BYTES``.

    At least 1, and no more than ``n_tokens`` rounded up to a power of two. GPT-2's vocabulary of
    50257 gives 1024 tokens per chunk; Llama-2's 32000 gives 2048.
    """
    fitting = max(1, CHUNK_LOGITS_BYTES // (4 * vocab_size))
    return min(1 << (fitting.bit_length() - 1), 1 << max(0, n_tokens - 1).bit_length())


def check_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    chunk_size: int | None,
    vocab_size: int | None = None,
) -> None:
    """Shapes, dtypes, devices and options of ``fused_linear_cross_entropy``; ``vocab_size`` in
    [1, V] or None; labels in [0, vocab_size) (or [0, V)) or ignored.

    Label values are checked for CPU tensors in eager mode only. On a GPU the check would be a
    host-device synchronisation, stalling the host until the forward pass has run, and a compiled
    graph cannot raise from data; there the Triton kernel gives an out-of-range label a NaN loss.
    """
    if reduction not in REDUCTIONS:
        raise ConfigError(
            f"unknown reduction {reduction!r}", path="reduction", choices=REDUCTIONS, got=reduction
        )
    if chunk_size is not None and (
        isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
    ):
        raise ConfigError(f"chunk_size must be a positive int or None, got {chunk_size!r}", path="chunk_size")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ConfigError(f"ignore_index must be an int, got {ignore_index!r}", path="ignore_index")
    check_float("hidden", hidden)
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            "hidden [..., D] and weight [V, D] must agree on D, "
            f"got {tuple(hidden.shape)} and {tuple(weight.shape)}"
        )
    rows = weight.shape[0]
    if vocab_size is not None and (
        isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= rows
    ):
        reason = f"vocab_size must be an int in [1, {rows}] (the weight's rows) or None, got {vocab_size!r}"
        raise ConfigError(reason, path="vocab_size")
    if weight.dtype != hidden.dtype:
        raise TypeError(f"weight has dtype {weight.dtype} but hidden has {hidden.dtype}; they must match")
    if bias is not None and (bias.shape != weight.shape[:1] or bias.dtype != hidden.dtype):
        raise ValueError(
            f"bias must have shape ({weight.shape[0]},) and dtype {hidden.dtype}, "
            f"got {tuple(bias.shape)} {bias.dtype}"
        )
    if labels.dtype not in (torch.int64, torch.int32) or labels.shape != hidden.shape[:-1]:
        raise TypeError(
            f"labels must be an int64 or int32 tensor of shape {tuple(hidden.shape[:-1])}, "
            f"got {labels.dtype} of shape {tuple(labels.shape)}"
        )
    devices = {t.device for t in (hidden, weight, labels, bias) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devices)}")
    if labels.device.type == "cpu" and not torch.compiler.is_compiling():
        vocab = rows if vocab_size is None else vocab_size
        bad = (labels != ignore_index) & ((labels < 0) | (labels >= vocab))
        if bad.any():
            raise ValueError(
                f"label {labels[bad][0].item()} is outside [0, {vocab}) and is not ignore_index "
                f"({ignore_index})"
            )


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and every needed gradient chunk by chunk; backward scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, bias, ignore_index, reduction, chunk_size, chunk_step, vocab):
        needs_hidden, needs_weight, _, needs_bias = ctx.needs_input_grad[:4]
        compute_grad = needs_hidden or needs_weight or needs_bias
        n_tokens, device = hidden.shape[0], hidden.device
        rows = weight.shape[0]  # vocab of them real, the others the caller's padding
        if pads_vocabulary(weight):
            pad = -rows % VOCAB_ALIGNMENT
            weight = F.pad(weight, (0, 0, 0, pad))
            bias = None if bias is None else F.pad(bias, (0, pad))
        # Sums across chunks in float32 (float64 inputs: float64); a weight of that dtype adds in place.
        acc = _compute_dtype(hidden)
        # CUDA only: the overload has no CPU kernel. (This function never runs while compiling.)
        addmm_to_acc = (
            weight.is_cuda and weight.dtype != acc and addmm_accumulates_in_float32(device, weight.dtype)
        )
        grad_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=device) if needs_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=device) if needs_weight else None
        grad_bias = torch.zeros(weight.shape[0], dtype=acc, device=device) if needs_bias else None
        loss_sum = torch.zeros((), dtype=acc, device=device)
        for start in range(0, n_tokens, chunk_size):
            end = min(start + chunk_size, n_tokens)
            chunk = hidden[start:end]
            logits = F.linear(chunk, weight, bias)  # [C, rows] or aligned; becomes d loss_sum / d logits
            # The whole buffer: the chunk step also zeroes the padding columns' gradient, so they add
            # nothing below (they are 0 for finite hidden states, but 0 * inf is NaN).
            loss_sum += chunk_step(logits, labels[start:end], ignore_index, compute_grad, vocab).sum()
            if grad_hidden is not None:
                torch.mm(logits, weight, out=grad_hidden[start:end])
            if grad_weight is not None:
                if weight.dtype == acc:
                    grad_weight.addmm_(logits.t(), chunk)
                elif addmm_to_acc:
                    torch.addmm(grad_weight, logits.t(), chunk, out_dtype=acc, out=grad_weight)
                else:
                    grad_weight += (logits.t() @ chunk).to(acc)
            if grad_bias is not None:
                grad_bias += logits.sum(0, dtype=acc)
        count = (labels != ignore_index).sum()
        scale = 1.0 / count if reduction == "mean" else None
        grads = [grad_hidden, grad_weight, grad_bias]
        if scale is not None:
            grads = [None if g is None else g.mul_(scale) for g in grads]
        grads[1:] = [None if g is None else g[:rows].to(weight.dtype) for g in grads[1:]]
        ctx.save_for_backward(*grads)
        return loss_sum if scale is None else loss_sum * scale

    @staticmethod
    def backward(ctx, grad_loss):
        # In place: a second copy of the weight gradient would double the memory this saves. (A second
        # backward through the same graph then fails autograd's saved-tensor version check.)
        grad_hidden, grad_weight, grad_bias = (
            None if g is None else g.mul_(grad_loss) for g in ctx.saved_tensors
        )
        return grad_hidden, grad_weight, None, grad_bias, None, None, None, None, None


def linear_cross_entropy_torch(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    chunk_size: int | None,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """The torch path on checked inputs; hidden [..., D] -> a scalar, float32 (float64 inputs: float64).

    Where one chunk would hold every token and the logits need no float32 upcast (float32 and float64
    inputs), it is ``F.cross_entropy(F.linear(hidden, weight, bias), labels)``: the chunked function
    would hold the same [N, V] logits, so chunking saves nothing there, and its chunk step's extra
    passes (the logits turned into their gradient in place, the gradients scaled in backward) cost
    more than autograd's. The loss and gradients are the same up to rounding. Elsewhere the chunked
    function with the torch chunk step.
    """
    n_tokens = math.prod(hidden.shape[:-1])
    chunk = chunk_size or default_chunk_size(n_tokens, weight.shape[0])
    if chunk < n_tokens or hidden.dtype not in (torch.float32, torch.float64):
        return linear_cross_entropy(
            hidden, weight, labels, bias, ignore_index, reduction, chunk, vocab_size=vocab_size
        )
    logits = F.linear(hidden, weight, bias).reshape(-1, weight.shape[0])[:, :vocab_size]
    return F.cross_entropy(logits, labels.reshape(-1), ignore_index=ignore_index, reduction=reduction)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    chunk_size: int | None,
    chunk_step: ChunkStep = cross_entropy_chunk_ref,
    *,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """The chunked loss on checked inputs with the given chunk step; hidden [..., D] -> a scalar.

    The loss is float32 (float64 for float64 inputs, which only the torch twin takes). ``vocab_size``:
    the weight's real rows (None: all of them).
    """
    hidden2 = hidden.reshape(-1, hidden.shape[-1])
    labels1 = labels.reshape(-1)
    chunk = chunk_size or default_chunk_size(hidden2.shape[0], weight.shape[0])
    vocab = weight.shape[0] if vocab_size is None else vocab_size
    if torch.compiler.is_compiling():
        return checkpointed_chunks(hidden2, weight, labels1, bias, ignore_index, reduction, chunk, vocab)
    return _FusedLinearCrossEntropy.apply(
        hidden2, weight, labels1, bias, ignore_index, reduction, chunk, chunk_step, vocab
    )


def checkpointed_chunks(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    bias: torch.Tensor | None,
    ignore_index: int,
    reduction: str,
    chunk_size: int,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """The loss as the compiled path computes it: hidden [N, D], labels [N] -> a scalar; scored over the
    weight's first ``vocab_size`` rows (None: all).

    Each chunk's loss is checkpointed, so the backward pass recomputes its logits rather than keeping
    them: one chunk of logits is alive at a time, at the cost of one more matmul per chunk.
    """

    def chunk_loss_sum(chunk: torch.Tensor, chunk_labels: torch.Tensor) -> torch.Tensor:
        # Logits in the weight's dtype, the softmax in float32 or wider.
        logits = F.linear(chunk, weight, bias)[:, :vocab_size].to(_compute_dtype(chunk))
        return F.cross_entropy(logits, chunk_labels, ignore_index=ignore_index, reduction="sum")

    total = sum(
        checkpoint(
            chunk_loss_sum,
            hidden[start : start + chunk_size],
            labels[start : start + chunk_size],
            use_reentrant=False,
        )
        for start in range(0, hidden.shape[0], chunk_size)
    )
    return total / (labels != ignore_index).sum() if reduction == "mean" else total
