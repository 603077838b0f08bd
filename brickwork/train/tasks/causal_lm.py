"""``causal_lm``: next-token prediction on windows of text, packed documents included."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from brickwork.blocks.decoder_lm import DecoderLM
from brickwork.blocks.output import shift_labels
from brickwork.data import fixed_windows
from brickwork.data.packing import packed_rows
from brickwork.data.task_batches import windows
from brickwork.parallel import parallel_state
from brickwork.train.losses import IGNORE_INDEX
from brickwork.train.tasks.base import Batch, LossAndCount, register_task
from brickwork.train.tasks.text import TextTask

if TYPE_CHECKING:
    from brickwork.data.sources import TextData
    from brickwork.train.run_config import RunConfig


def causal_lm_batch(
    tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, end_id: int | None = None
) -> dict[str, torch.Tensor]:
    """Windows and their labels (the windows themselves: HF's meaning, the model shifts them); with
    ``end_id`` (``data.pack``), packed rows with ``document_ids``."""
    w = windows(tokens, rows, seq_len, g)
    if end_id is not None:
        return packed_rows(w, end_id)
    return {"input_ids": w, "labels": w.clone()}


@register_task("causal_lm")
class CausalLM(TextTask):
    """Next-token prediction: ``labels`` [B, T] are the input ids (HF's meaning), -100 = not scored;
    :meth:`align` shifts them into ``shift_labels`` (position t scored against label t + 1).
    ``document_ids`` [B, T], when the batch has them, pack documents (``DecoderLM.forward``).

    A brickwork decoder whose LM head weight is whole on this rank (one process, DDP, ZeRO-1/2/3,
    context and expert parallel: every layout without tensor parallel) skips the logits: it is called
    as ``model(input_ids, shift_labels=...)``, whose fused linear + cross-entropy kernel reads the final
    hidden states and the head weight chunk by chunk, never holding the [B, T, vocab] logits or their
    gradient. Through the model's own call, so DDP's and FSDP2's forward hooks run around it.
    """

    inputs = ("input_ids", "attention_mask", "document_ids")
    required = ("input_ids",)
    pipeline_input = "input_ids"
    target_key = "shift_labels"
    perplexity = True
    samples_text = True
    packs = True

    def align(self, batch: Batch) -> Batch:
        self.check(batch)
        aligned = {k: v for k, v in batch.items() if k != "labels"}
        aligned["shift_labels"] = shift_labels(batch["labels"], IGNORE_INDEX)
        return aligned

    def __call__(self, model: nn.Module, batch: Batch) -> LossAndCount:
        if not fuses_head_loss(model):
            return super().__call__(model, batch)
        inputs = {k: batch[k] for k in self.inputs if k in batch}
        # num_items_in_batch=1 makes out.loss the summed loss itself (x / 1 is exact): the tensor under
        # the output's "loss" key, on which FSDP2 hooks the re-gathering of the weights for backward.
        targets = batch[self.target_key]
        # No logits, in evaluation too: only the loss is read, and [B, T, vocab] would outgrow the step.
        out = model(
            **inputs,
            shift_labels=targets,
            num_items_in_batch=1,
            ignore_index=IGNORE_INDEX,
            return_logits=False,
        )
        return out.loss, out.count

    def draw(
        self, tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, base: int, end_id: int | None
    ) -> dict[str, torch.Tensor]:
        return causal_lm_batch(tokens, rows, seq_len, g, end_id)

    def validation_batches(self, run: RunConfig, text: TextData | None) -> list[dict[str, torch.Tensor]]:
        """Evenly spaced windows of the held-out tokens (``fixed_windows``), packed where the run packs."""
        cfg = run.train
        inputs, _ = fixed_windows(text.val, cfg.eval_batches * cfg.batch_size, cfg.seq_len)
        if text.end_id is not None:
            return [packed_rows(x, text.end_id) for x in inputs.split(cfg.batch_size)]
        return [{"input_ids": x, "labels": x} for x in inputs.split(cfg.batch_size)]  # HF's: shifted inside


def fuses_head_loss(model: nn.Module) -> bool:
    """Whether ``causal_lm`` takes ``model``'s fused head loss: a brickwork DecoderLM whose head weight
    is whole on this rank. Tensor parallel splits it over the vocabulary (its logits go to
    ``vocab_parallel_cross_entropy``); a pipeline's stages are not the DecoderLM (the last one's
    logits go to :meth:`Task.loss`)."""
    if not isinstance(model, DecoderLM):
        return False
    state = parallel_state(model)
    return state is None or state.config.tensor_parallel_size == 1
