"""What the tasks on text share: batches cut from the token streams of the run's tokenizer.

A text task takes a stream of ids below ``base`` (the tokenizer's vocabulary: 256 for bytes) and adds
``extra_ids`` of its own above it (a mask id, sentinels), so a model's vocabulary is
:meth:`TextTask.vocab_size`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from brickwork.data.task_batches import TaskBatches
from brickwork.data.tokenizer import ByteTokenizer
from brickwork.train.tasks.base import TASKS, Task

if TYPE_CHECKING:
    from brickwork.data.sources import TextData
    from brickwork.train.run_config import RunConfig

BYTES = ByteTokenizer.vocab_size


class TextTask(Task):
    """A task whose batches :meth:`draw` cuts from a token stream; ``extra_ids`` are the ids it adds
    past the tokenizer's, ``extra_ids_note`` says what they are in a log line (`` and the mask id``)."""

    extra_ids = 0
    extra_ids_note = ""

    def vocab_size(self, base: int) -> int:
        """The vocabulary a model needs for this task on data of ``base`` ids (bytes: 256, 257, 272)."""
        return base + self.extra_ids

    def draw(
        self, tokens: torch.Tensor, rows: int, seq_len: int, g: torch.Generator, base: int, end_id: int | None
    ) -> dict[str, torch.Tensor]:
        """One batch of ``rows`` rows from windows of ``seq_len`` tokens of ``tokens`` (ids below
        ``base``); ``end_id`` ends each packed document where the task :attr:`packs` them."""
        raise NotImplementedError

    def text_batches(
        self,
        tokens: torch.Tensor,
        rows: int,
        seq_len: int,
        seed: int,
        base: int = BYTES,
        end_id: int | None = None,
    ) -> TaskBatches:
        """Batches from a stream of ids below ``base``, long enough for a window of ``seq_len`` tokens and
        the one after it; ``end_id`` packs documents that each end with it (brickwork/data/packing.py),
        for a task that :attr:`packs`."""
        if end_id is not None and not self.packs:
            packing = ", ".join(n for n, t in TASKS.items() if t.packs)
            raise ValueError(f"packed documents train {packing}, not {self.name!r}")
        if tokens.numel() < seq_len + 1:
            raise ValueError(
                f"need at least {seq_len + 1} tokens for windows of seq_len={seq_len}, got {tokens.numel()}"
            )
        return TaskBatches(lambda n, g: self.draw(tokens, n, seq_len, g, base, end_id), rows, seed)

    def train_batches(self, run: RunConfig, text: TextData | None) -> TaskBatches:
        cfg = run.train
        base = text.tokenizer.vocab_size
        return self.text_batches(text.train, cfg.batch_size, cfg.seq_len, cfg.seed, base, text.end_id)

    def validation_batches(self, run: RunConfig, text: TextData | None) -> list[dict[str, torch.Tensor]]:
        cfg = run.train
        held_out = self.text_batches(
            text.val, cfg.batch_size, cfg.seq_len, cfg.seed, text.tokenizer.vocab_size
        )
        return held_out.validation(cfg.eval_batches)

    def describe_data(self, run: RunConfig, text: TextData | None) -> str:
        return text.description
