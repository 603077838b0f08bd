"""Resumable batches drawn from a seeded generator, and the random windows of a token stream that the
text tasks cut them from. What a batch holds is its task's (brickwork/train/tasks/).

Each source draws from its own seeded generator, whose state is the whole data position (saved with
a checkpoint). Validation batches are drawn by a generator of their own, so they are fixed per run.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Batch = dict[str, torch.Tensor]


def windows(tokens: torch.Tensor, count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``length`` tokens at random offsets: [count, length]."""
    starts = torch.randint(0, tokens.numel() - length + 1, (count,), generator=generator)
    return tokens[starts[:, None] + torch.arange(length)].long()


class TaskBatches:
    """Global batches of ``rows`` rows, ``draw(rows, generator)``, from a seeded generator (resumable)."""

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
