"""``masked_lm``: BERT's masked-token prediction.

Of each window 15% of positions are scored; of those 80% become the mask id ``base`` (``MASK_ID``
for bytes), 10% a random token, 10% stay. ``labels`` hold the original token there and -100
elsewhere.
"""

from __future__ import annotations

import torch

from brickwork.blocks import IGNORE_INDEX
from brickwork.data.task_batches import windows
from brickwork.train.tasks.base import register_task
from brickwork.train.tasks.text import BYTES, TextTask

MASK_ID = BYTES  # the one token a masked-LM vocabulary adds to the bytes
NOISE_DENSITY = 0.15


def masked_lm_batch(
    tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, base: int = BYTES
) -> dict[str, torch.Tensor]:
    """BERT-masked windows of ids below ``base`` (the mask id is ``base``) and their labels."""
    original = windows(tokens, rows, seq_len, g)
    scored = torch.rand(original.shape, generator=g) < NOISE_DENSITY
    scored[:, 0] |= ~scored.any(dim=1)  # every row scores at least one position
    choice = torch.rand(original.shape, generator=g)
    random_ids = torch.randint(0, base, original.shape, generator=g)
    inputs = torch.where(scored & (choice < 0.8), base, original)
    inputs = torch.where(scored & (choice >= 0.8) & (choice < 0.9), random_ids, inputs)
    labels = torch.where(scored, original, IGNORE_INDEX)
    return {"input_ids": inputs, "labels": labels}


@register_task("masked_lm")
class MaskedLM(TextTask):
    """BERT's masked-token prediction: ``labels`` [B, T] hold the original ids at masked positions."""

    inputs = ("input_ids", "attention_mask", "token_type_ids")
    required = ("input_ids",)
    pipeline_input = "input_ids"
    perplexity = True
    extra_ids = 1
    extra_ids_note = " and the mask id"

    def draw(
        self, tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, base: int, end_id: int | None
    ) -> dict[str, torch.Tensor]:
        return masked_lm_batch(tokens, rows, seq_len, g, base)
