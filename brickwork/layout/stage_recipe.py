"""A pipeline recipe: how one kind of model splits into stages, each a contiguous run of its layers
plus the modules around them that the stage's place needs (the embedding first, the head last).

A recipe names the ModuleLists whose layers are split (one list, or an encoder's and a decoder's in
turn), the other modules a stage needs for its run of layers, and how that run computes. It is a
declaration: parallel/pipeline/stages.py cuts the stages and runs them under the schedule, and hands
``run`` each stage as a :class:`Stage`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn


class Stage(Protocol):
    """What a recipe's ``run`` reads of the stage it computes: its place in the pipeline, its run of
    layers (``units``), and the model's modules it holds, under their dotted names in the model."""

    is_first: bool
    is_last: bool
    units: list[tuple[str, int]]

    @property
    def shell(self) -> nn.Module:
        """The model, seeing this stage's modules and parameters only: its own methods run on it."""
        ...

    def get_submodule(self, target: str) -> nn.Module: ...


class StageRecipe:
    """How one kind of model splits into stages (see the module docstring).

    ``stacks`` are the dotted names of the ModuleLists whose layers are split, in the order the
    forward runs them; a stage's ``units`` index their concatenation.
    """

    stacks: tuple[str, ...] = ("layers",)

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def units(self) -> list[tuple[str, int]]:
        """(stack, index) of every layer, in forward order."""
        return [(s, i) for s in self.stacks for i in range(len(self.model.get_submodule(s)))]

    def head_modules(self) -> list[str]:
        """The modules the last stage adds (for the cost of its head)."""
        raise NotImplementedError

    def outer_modules(self, units: Sequence[tuple[str, int]], first: bool, last: bool) -> list[str]:
        """The dotted names of the modules (or parameters) besides layers that a stage holding
        ``units`` needs."""
        raise NotImplementedError

    def run(self, stage: Stage, carried: tuple, extras: dict[str, torch.Tensor]) -> Any:
        """The stage's computation: ``carried`` (the first stage's input, or the previous stage's
        outputs) and the batch's ``extras`` -> what the next stage receives, or the logits."""
        raise NotImplementedError
