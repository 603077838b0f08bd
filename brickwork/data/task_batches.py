"""Batch dicts (HF key names) for every built-in task, from a token stream or a generated image set.

The text tasks take a stream of ids below ``base`` (the tokenizer's vocabulary: 256 for bytes) and
add their own ids above it, so a model's vocabulary is ``task_vocab_size(task, base)``.

- ``causal_lm``: windows of tokens; ``labels`` are the inputs themselves (HF's meaning: the model
  shifts them). With ``data.pack``, also ``document_ids`` (brickwork/data/packing.py).
- ``masked_lm``: BERT's masking: 15% of positions are scored; of those 80% become the mask id
  ``base`` (``MASK_ID`` for bytes), 10% a random token, 10% stay. ``labels`` hold the original token
  there and -100 elsewhere.
- ``seq2seq``: T5's span corruption: spans of ``SPAN_LENGTH`` tokens covering ~15% of a window are
  cut out, each replaced in ``input_ids`` by its own sentinel (``base + s``); ``labels`` are each
  sentinel followed by its span, and ``decoder_input_ids`` are the labels shifted right behind
  ``DECODER_START_ID`` (id 0).
- ``image_classification``: generated images, each class a sinusoidal grating of its own orientation
  and frequency under Gaussian noise, at a random phase: learnable, different every draw.

Each source draws from its own seeded generator, whose state is the whole data position (saved with
a checkpoint). Validation batches are drawn by a generator of their own, so they are fixed per run.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from brickwork.blocks import IGNORE_INDEX
from brickwork.data.packing import packed_rows

BYTES = 256
MASK_ID = BYTES  # the one token a masked-LM vocabulary adds to the bytes
NUM_SENTINELS = 16  # T5 sentinels: ids 256 .. 271
DECODER_START_ID = 0
SPAN_LENGTH = 3
NOISE_DENSITY = 0.15
IMAGE_CLASSES = 10  # the generated set uses the first classes of the head
EXTRA_IDS = {"causal_lm": 0, "masked_lm": 1, "seq2seq": NUM_SENTINELS}  # ids a task adds to its data's

Batch = dict[str, torch.Tensor]


def windows(tokens: torch.Tensor, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``length`` tokens at random offsets: [count, length]."""
    starts = torch.randint(0, tokens.numel() - length + 1, (count,), generator=generator)
    return tokens[starts[:, None] + torch.arange(length)].long()


def task_vocab_size(task: str, base: int) -> int:
    """The vocabulary a model needs for ``task`` on data of ``base`` ids (bytes: 256, 257, 272)."""
    return base + EXTRA_IDS[task]


def causal_lm_batch(
    tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, end_id: int | None = None
) -> Batch:
    """Windows and their labels; with ``end_id`` (``data.pack``), packed rows with ``document_ids``."""
    w = windows(tokens, rows, seq_len, g)
    if end_id is not None:
        return packed_rows(w, end_id)
    return {"input_ids": w, "labels": w.clone()}


def masked_lm_batch(
    tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, base: int = BYTES
) -> Batch:
    original = windows(tokens, rows, seq_len, g)
    scored = torch.rand(original.shape, generator=g) < NOISE_DENSITY
    scored[:, 0] |= ~scored.any(dim=1)  # every row scores at least one position
    choice = torch.rand(original.shape, generator=g)
    random_ids = torch.randint(0, base, original.shape, generator=g)
    inputs = torch.where(scored & (choice < 0.8), base, original)
    inputs = torch.where(scored & (choice >= 0.8) & (choice < 0.9), random_ids, inputs)
    labels = torch.where(scored, original, IGNORE_INDEX)
    return {"input_ids": inputs, "labels": labels}


def span_count(seq_len: int) -> int:
    """Spans cut from a window of ``seq_len`` bytes (at least one, at most the sentinels)."""
    return max(1, min(NUM_SENTINELS, round(seq_len * NOISE_DENSITY / SPAN_LENGTH)))


def seq2seq_batch(
    tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, base: int = BYTES
) -> Batch:
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


def image_batch(image_size: int, channels: int, classes: int, rows: int, g: torch.Generator) -> Batch:
    labels = torch.randint(0, classes, (rows,), generator=g)
    angle = labels.double() * math.pi / classes
    frequency = 2 * math.pi * (1 + labels.double() % 3) / image_size * 2
    phase = torch.rand(rows, generator=g, dtype=torch.float64) * 2 * math.pi
    grid = torch.arange(image_size, dtype=torch.float64)
    y, x = torch.meshgrid(grid, grid, indexing="ij")
    along = torch.cos(angle)[:, None, None] * x + torch.sin(angle)[:, None, None] * y
    pattern = torch.sin(frequency[:, None, None] * along + phase[:, None, None])
    noise = 0.5 * torch.randn((rows, channels, image_size, image_size), generator=g, dtype=torch.float64)
    return {"pixel_values": (pattern[:, None] + noise).float(), "labels": labels}


class TaskBatches:
    """Global batches of ``rows`` rows for ``task``, drawn from a seeded generator (resumable)."""

    def __init__(self, draw: Callable[[int, torch.Generator], Batch], rows: int, seed: int) -> None:
        self.draw = draw
        self.rows = rows
        self.generator = torch.Generator().manual_seed(seed)
        self.seed = seed

    def next_batch(self) -> Batch:
        return self.draw(self.rows, self.generator)

    def validation(self, count: int) -> list[Batch]:
        """``count`` fixed batches, from a generator of their own (the same in every run)."""
        g = torch.Generator().manual_seed(self.seed + 1_000_003)
        return [self.draw(self.rows, g) for _ in range(count)]

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.generator.set_state(state["generator"])


def text_batches(
    task: str,
    tokens: torch.Tensor,
    rows: int,
    seq_len: int,
    seed: int,
    base: int = BYTES,
    end_id: int | None = None,
) -> TaskBatches:
    """Batches of ``task`` (causal_lm, masked_lm or seq2seq) from a stream of ids below ``base``;
    ``end_id`` (causal_lm only) packs documents that each end with it (brickwork/data/packing.py)."""
    if end_id is not None and task != "causal_lm":
        raise ValueError(f"packed documents train causal_lm, not {task!r}")
    draw = {
        "causal_lm": functools.partial(causal_lm_batch, end_id=end_id),
        "masked_lm": functools.partial(masked_lm_batch, base=base),
        "seq2seq": functools.partial(seq2seq_batch, base=base),
    }[task]
    need = seq_len + 1
    if tokens.numel() < need:
        raise ValueError(
            f"need at least {need} tokens for windows of seq_len={seq_len}, got {tokens.numel()}"
        )
    return TaskBatches(lambda n, g: draw(tokens, n, seq_len, g), rows, seed)


def image_batches(image_size: int, channels: int, num_classes: int, rows: int, seed: int) -> TaskBatches:
    """Batches of generated images for an image classifier with ``num_classes`` outputs."""
    classes = min(IMAGE_CLASSES, num_classes)
    return TaskBatches(lambda n, g: image_batch(image_size, channels, classes, n, g), rows, seed)
