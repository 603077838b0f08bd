"""Pre-norm, post-norm and parallel residual styles."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Branch, ResidualStyle, apply_norm, register_residual


@register_residual("pre")
class PreNormResidual(ResidualStyle):
    """``x = x + fn(norm(x))`` for each branch (GPT-2, LLaMA): the stream itself is never normalised."""

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        for norm, fn in branches:
            x = x + fn(apply_norm(norm, x))
        return x


@register_residual("post")
class PostNormResidual(ResidualStyle):
    """``x = norm(x + fn(x))`` for each branch (the original Transformer, BERT)."""

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        for norm, fn in branches:
            x = apply_norm(norm, x + fn(x))
        return x


@register_residual("parallel")
class ParallelResidual(ResidualStyle):
    """``x + sum(fn(norm(x)))`` over all branches, each off the same input (GPT-J, GPT-NeoX, PaLM)."""

    def forward(self, x: torch.Tensor, branches: Sequence[Branch]) -> torch.Tensor:
        out = x
        for norm, fn in branches:
            out = out + fn(apply_norm(norm, x))
        return out
