"""``seq2seq``: T5's span corruption.

Spans of ``SPAN_LENGTH`` tokens covering ~15% of a window are cut out, each replaced in
``input_ids`` by its own sentinel (``base + s``); ``labels`` are each sentinel followed by its span,
and ``decoder_input_ids`` are the labels shifted right behind ``DECODER_START_ID`` (id 0).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from brickwork.blocks.encoder_decoder import EncoderDecoder
from brickwork.data.task_batches import windows
from brickwork.train.tasks.base import Batch, register_task
from brickwork.train.tasks.text import BYTES, TextTask

NUM_SENTINELS = 16  # T5 sentinels: ids 256 .. 271 for bytes
DECODER_START_ID = 0
SPAN_LENGTH = 3
NOISE_DENSITY = 0.15


def span_count(seq_len: int) -> int:
    """Spans cut from a window of ``seq_len`` tokens (at least one, at most the sentinels)."""
    return max(1, min(NUM_SENTINELS, round(seq_len * NOISE_DENSITY / SPAN_LENGTH)))


def seq2seq_batch(
    tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, base: int = BYTES
) -> dict[str, torch.Tensor]:
    """Inputs [rows, seq_len - spans × (SPAN_LENGTH - 1)], labels [rows, spans × (SPAN_LENGTH + 1)]."""
    original = windows(tokens, rows, seq_len, g)
    spans = span_count(seq_len)
    segment = seq_len // spans  # one span per segment, so spans never overlap
    offsets = torch.randint(0, segment - SPAN_LENGTH + 1, (rows, spans), generator=g)
    inputs, labels = [], []
    for row in range(rows):
        kept, target, cursor = [], [], 0
        for s in range(spans):
            start = s * segment + int(offsets[row, s])
            sentinel = torch.tensor([base + s])
            kept += [original[row, cursor:start], sentinel]
            target += [sentinel, original[row, start : start + SPAN_LENGTH]]
            cursor = start + SPAN_LENGTH
        kept.append(original[row, cursor:])
        inputs.append(torch.cat(kept))
        labels.append(torch.cat(target))
    label_ids = torch.stack(labels)
    start = torch.full((rows, 1), DECODER_START_ID, dtype=label_ids.dtype)
    return {
        "input_ids": torch.stack(inputs),
        "decoder_input_ids": torch.cat([start, label_ids[:, :-1]], dim=1),
        "labels": label_ids,
    }


@register_task("seq2seq")
class Seq2Seq(TextTask):
    """T5-style: the encoder reads ``input_ids``, the decoder ``decoder_input_ids``; ``labels`` [B, T]
    score the decoder positions. brickwork's EncoderDecoder names its inputs src/tgt/src_mask."""

    inputs = ("input_ids", "attention_mask", "decoder_input_ids")
    required = ("input_ids", "decoder_input_ids")
    pipeline_input = "input_ids"
    extra_ids = NUM_SENTINELS
    extra_ids_note = f" and {NUM_SENTINELS} sentinels"

    def model_lengths(self, seq_len: int) -> tuple[int, int]:
        spans = span_count(seq_len)  # each span leaves its sentinel in the input, and adds it to the labels
        return seq_len - spans * (SPAN_LENGTH - 1), spans * (SPAN_LENGTH + 1)

    def forward(self, model: nn.Module, batch: Batch) -> Any:
        if isinstance(model, EncoderDecoder):
            return model(batch["input_ids"], batch["decoder_input_ids"], src_mask=batch.get("attention_mask"))
        return super().forward(model, batch)

    def draw(
        self, tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, base: int, end_id: int | None
    ) -> dict[str, torch.Tensor]:
        return seq2seq_batch(tokens, rows, seq_len, g, base)
