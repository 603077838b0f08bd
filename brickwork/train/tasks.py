"""Tasks: how a batch goes into the model and what loss comes out, as ``(loss_sum, count)``.

A task is the only place a loss is defined. Batches carry HF's labels (a causal LM's are its input
ids); :meth:`Task.align` first turns them into the targets aligned with the positions they score
(the causal LM shifts them into ``shift_labels``), once per batch and before context parallel splits
the sequence, so every layout splits targets that no longer need their neighbour. Each built-in task
also says which batch key the first pipeline stage takes, so the same task drives a pipeline: the
schedule feeds that input through the stages and calls :meth:`Task.loss` on the last stage's output.
A user's own task is a callable ``(model, batch) -> (loss_sum, count)`` that gets the batch as it
was given; it cannot be split over pipeline stages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from brickwork.blocks.decoder_lm import DecoderLM
from brickwork.blocks.encoder_decoder import EncoderDecoder
from brickwork.blocks.output import shift_labels
from brickwork.parallel import parallel_state
from brickwork.train.losses import IGNORE_INDEX, logits_of, vocab_parallel_cross_entropy

Batch = Mapping[str, torch.Tensor]
LossAndCount = tuple[torch.Tensor, torch.Tensor]
TaskFn = Callable[[nn.Module, Batch], LossAndCount]


class Task:
    """A built-in task: ``task(model, task.align(batch)) -> (loss_sum, count)``.

    ``inputs`` are the batch keys the model takes (by HF's names), ``pipeline_input`` the one the
    first pipeline stage takes; ``labels`` is always the target, and ``target_key`` the key of the
    aligned targets after :meth:`align`.
    """

    name = ""
    inputs: tuple[str, ...] = ()
    required: tuple[str, ...] = ()
    pipeline_input = ""
    target_key = "labels"

    def check(self, batch: Batch) -> None:
        """ValueError naming the keys when the batch lacks one the task needs or has one it ignores."""
        missing = [k for k in (*self.required, "labels") if k not in batch]
        unknown = [k for k in batch if k not in (*self.inputs, "labels")]
        if missing or unknown:
            raise ValueError(
                f"task {self.name!r} takes batch keys {[*self.inputs, 'labels']} "
                f"(required: {[*self.required, 'labels']}); missing {missing}, not understood {unknown}"
            )

    def align(self, batch: Batch) -> Batch:
        """``batch`` checked, with its labels as the targets aligned to the positions they score."""
        self.check(batch)
        return batch

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        """The model's output on ``batch``."""
        return model(**{k: batch[k] for k in self.inputs if k in batch})

    def loss(self, output: Any, labels: torch.Tensor) -> LossAndCount:
        """(summed loss, count) of the model's output against ``labels``."""
        return vocab_parallel_cross_entropy(logits_of(output), labels)

    def __call__(self, model: nn.Module, batch: Batch) -> LossAndCount:
        """The summed loss and count of an aligned batch (what :meth:`align` returned)."""
        return self.loss(self.forward(model, batch), batch[self.target_key])


class CausalLM(Task):
    """Next-token prediction: ``labels`` [B, T] are the input ids (HF's meaning), -100 = not scored;
    :meth:`align` shifts them into ``shift_labels`` (position t scored against label t + 1).
    ``document_ids`` [B, T], when the batch has them, pack documents (``DecoderLM.forward``).

    A brickwork decoder whose LM head weight is whole on this rank (one process, DDP, ZeRO-1/2/3,
    context and expert parallel: every layout without tensor parallel) skips the logits: it is called
    as ``model(input_ids, shift_labels=...)``, whose fused linear + cross-entropy kernel reads the final
    hidden states and the head weight chunk by chunk, never holding the [B, T, vocab] logits or their
    gradient. Through the model's own call, so DDP's and FSDP2's forward hooks run around it.
    """

    name = "causal_lm"
    inputs = ("input_ids", "attention_mask", "document_ids")
    required = ("input_ids",)
    pipeline_input = "input_ids"
    target_key = "shift_labels"

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


def fuses_head_loss(model: nn.Module) -> bool:
    """Whether ``causal_lm`` takes ``model``'s fused head loss: a brickwork DecoderLM whose head weight
    is whole on this rank. Tensor parallel splits it over the vocabulary (its logits go to
    ``vocab_parallel_cross_entropy``); a pipeline's stages are not the DecoderLM (the last one's
    logits go to :meth:`Task.loss`)."""
    if not isinstance(model, DecoderLM):
        return False
    state = parallel_state(model)
    return state is None or state.config.tensor_parallel_size == 1


class MaskedLM(Task):
    """BERT's masked-token prediction: ``labels`` [B, T] hold the original ids at masked positions."""

    name = "masked_lm"
    inputs = ("input_ids", "attention_mask", "token_type_ids")
    required = ("input_ids",)
    pipeline_input = "input_ids"


class Seq2Seq(Task):
    """T5-style: the encoder reads ``input_ids``, the decoder ``decoder_input_ids``; ``labels`` [B, T]
    score the decoder positions. brickwork's EncoderDecoder names its inputs src/tgt/src_mask."""

    name = "seq2seq"
    inputs = ("input_ids", "attention_mask", "decoder_input_ids")
    required = ("input_ids", "decoder_input_ids")
    pipeline_input = "input_ids"

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        if isinstance(model, EncoderDecoder):
            return model(batch["input_ids"], batch["decoder_input_ids"], src_mask=batch.get("attention_mask"))
        return super().forward(model, batch)


class ImageClassification(Task):
    """``pixel_values`` [B, C, H, W] -> class logits [B, classes]; ``labels`` [B] class ids."""

    name = "image_classification"
    inputs = ("pixel_values",)
    required = ("pixel_values",)
    pipeline_input = "pixel_values"

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        return model(batch["pixel_values"])


TASKS: dict[str, Task] = {t.name: t for t in (CausalLM(), MaskedLM(), Seq2Seq(), ImageClassification())}


def get_task(task: str | Task | TaskFn) -> Task | TaskFn:
    """A task by name, or the callable given; ValueError listing the names otherwise."""
    if isinstance(task, str):
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of {sorted(TASKS)} or pass a callable")
        return TASKS[task]
    if not callable(task):
        raise TypeError(f"a task is a name or a callable (model, batch) -> (loss_sum, count), got {task!r}")
    return task
