"""What a model given ``labels=`` returns, and the label conventions it follows (HF's).

- A causal LM's ``labels`` are its input ids: label t + 1 scores position t, so the model shifts them
  (:func:`shift_labels`). HF's ``shift_labels`` are labels already shifted (context parallel needs
  them: the shift must happen before the sequence is split).
- A masked LM's labels sit at the positions they score; a seq2seq model's are the target ids, aligned
  with the decoder inputs; an image classifier's are one class id per image.
- -100 is never scored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


class LossOutput(dict):
    """HF's model output for a loss: ``out.loss`` = ``out["loss"]`` = ``out[0]``, ``out.logits``.

    ``loss`` is the mean over the scored labels (a scalar; divided by ``num_items_in_batch`` instead
    when HF's Trainer passes it). ``logits`` is None where a fused head never made them. As in HF's
    ``ModelOutput``, keys and positions hold only the fields that are not None, so ``out[1]`` is the
    logits when there are some. ``loss_sum`` (the summed loss, float32, float64 for a float64 model)
    and ``count`` (the scored labels, int64) are attributes, not keys: what data parallel and gradient
    accumulation divide by the count of the whole batch, and what HF's Trainer, which takes every key
    but ``loss`` for a prediction, does not gather. Rebuilt from a mapping of its keys (as
    accelerate's output conversion does), it has no ``loss_sum`` or ``count``.
    """

    def __init__(
        self,
        loss: torch.Tensor | Mapping[str, torch.Tensor],
        logits: torch.Tensor | None = None,
        loss_sum: torch.Tensor | None = None,
        count: torch.Tensor | None = None,
    ) -> None:
        if isinstance(loss, Mapping):  # rebuilt from its items, as HF's and accelerate's utilities do
            loss, logits = loss["loss"], loss.get("logits")
        fields = {"loss": loss, "logits": logits}
        super().__init__({k: v for k, v in fields.items() if v is not None})
        self.loss, self.logits, self.loss_sum, self.count = loss, logits, loss_sum, count

    def __getitem__(self, key: str | int | slice) -> Any:
        if isinstance(key, str):
            return super().__getitem__(key)
        return self.to_tuple()[key]

    def to_tuple(self) -> tuple[torch.Tensor, ...]:
        """The fields that are not None, in order: (loss, logits) or (loss,)."""
        return tuple(self.values())

    def __reduce__(self) -> tuple[Any, ...]:
        return LossOutput, (self.loss, self.logits, self.loss_sum, self.count)


def _flatten(out: LossOutput) -> tuple[list[torch.Tensor | None], None]:
    return [out.loss, out.logits, out.loss_sum, out.count], None


def _unflatten(children: list[torch.Tensor | None], _context: None) -> LossOutput:
    return LossOutput(*children)


# Data parallel finds and re-wraps the tensors of a forward's output through torch's pytree (DDP's
# gradient hooks, FSDP2's casts): registered, every field is seen and the output is rebuilt whole.
torch.utils._pytree.register_pytree_node(LossOutput, _flatten, _unflatten)


def mean_loss(
    loss_sum: torch.Tensor, count: torch.Tensor, num_items_in_batch: int | torch.Tensor | None
) -> torch.Tensor:
    """``loss_sum / count``, or ``loss_sum / num_items_in_batch`` when given: HF's Trainer passes the
    scored labels of the whole accumulated batch, so the summed gradients are those of its mean."""
    if num_items_in_batch is None:
        return loss_sum / count
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(loss_sum.device)
    return loss_sum / num_items_in_batch


def shift_labels(labels: torch.Tensor, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """Causal-LM labels [B, T] (the input ids) -> the targets aligned to the positions they score,
    [B, T]: ``out[:, t] = labels[:, t + 1]``, and the last position, which has no next token, ignored."""
    if labels.dim() < 1 or labels.shape[-1] < 1:
        raise ValueError(f"labels must be [..., T] with T >= 1, got shape {tuple(labels.shape)}")
    return F.pad(labels[..., 1:], (0, 1), value=ignore_index)


def causal_targets(
    labels: torch.Tensor | None, shifted: torch.Tensor | None, ignore_index: int
) -> torch.Tensor | None:
    """The aligned targets of a causal LM from ``labels`` (shifted here) or HF's ``shift_labels``
    (already aligned); ValueError when both are given."""
    if labels is not None and shifted is not None:
        raise ValueError(
            "give labels (the input ids, shifted inside) or shift_labels (already shifted), not both"
        )
    return shift_labels(labels, ignore_index) if labels is not None else shifted


def logits_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
) -> LossOutput:
    """The cross-entropy output of logits [..., V] against targets [...] aligned with them, in fp32."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"labels {tuple(targets.shape)} do not match the logits {tuple(logits.shape)} (labels score "
            "the positions they are aligned with)"
        )
    targets = targets.to(logits.device)
    loss_sum = F.cross_entropy(
        logits.flatten(0, -2).float(), targets.flatten(), ignore_index=ignore_index, reduction="sum"
    )
    count = (targets != ignore_index).sum()
    return LossOutput(mean_loss(loss_sum, count, num_items_in_batch), logits, loss_sum, count)
