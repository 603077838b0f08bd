"""Summed cross-entropy that works on plain logits and on logits split over the vocabulary (TP).

Every task reduces to ``(loss_sum, count)``: the train step divides by the count of the whole
accumulated, data-parallel batch, so the mean is over the global batch however it is split.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from brickwork.blocks.output import IGNORE_INDEX

__all__ = ["IGNORE_INDEX", "logits_of", "vocab_parallel_cross_entropy"]


def logits_of(output: Any) -> torch.Tensor:
    """The logits of a model's output: a tensor, or an object/dict with ``logits`` (HF models)."""
    if isinstance(output, torch.Tensor):
        return output
    logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"the model returned {type(output).__name__}, not logits or an object with .logits")
    return logits


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed token cross-entropy, number of scored labels), in fp32.

    logits ``[..., V]``, labels ``[...]`` (``ignore_index`` = not scored). Logits that tensor
    parallel left split over the vocabulary (a DTensor sharded on its last dim) are never gathered
    when this runs inside torch's ``loss_parallel()`` context, which computes the softmax from
    per-shard maxima and sums, forward and backward: :class:`~brickwork.train.step.TrainStep` and
    :func:`~brickwork.train.step.evaluate` run every task inside it whenever tensor parallel is on.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels {tuple(labels.shape)} do not match the logits {tuple(logits.shape)} (labels score "
            "the positions they are aligned with)"
        )
    flat_logits, flat_labels = logits.flatten(0, -2).float(), labels.flatten().to(logits.device)
    loss = F.cross_entropy(flat_logits, flat_labels, reduction="sum", ignore_index=ignore_index)
    if isinstance(loss, DTensor):
        loss = loss.to_local()
    return loss, (flat_labels != ignore_index).sum()
