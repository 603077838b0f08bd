"""A vocabulary that tensor parallel does not divide, or that the model padded itself, laid out over the
tensor-parallel ranks (the padding itself: brickwork/layout/vocab_padding.py).

The vocabulary-parallel embedding and the LM head (a colwise layer whose output leaves the model)
get ``padded`` rows, a multiple of ``tp × vocab_multiple`` (or the model's own padded rows, when tp
divides them), so every rank holds the same number of rows and the GEMMs have even shapes. Each rank's
shard holds its ``torch.chunk`` part of the real rows, then zero rows:

- token ids are moved to their padded row before the lookup;
- the head's logits keep only the real columns of each local shard before they leave it, so the
  model's output has the unpadded width;
- checkpoints hold the unpadded views (they reshard to any TP size, whose padding differs), and
  ``full_state_dict`` drops the padded rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from brickwork.layout.vocab_padding import VocabPadding, padded_names


def pad_source(model: nn.Module, source: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rank 0's unpadded full state dict (meta init, parallel/materialize.py) with ``model``'s padded
    parameters padded, so it loads into the padded shards."""
    padded = padded_names([model])
    return {k: padded[k].pad(v) if k in padded else v for k, v in source.items()}


def remap_ids_hook(padding: VocabPadding) -> Callable[[nn.Module, tuple], tuple]:
    """A forward pre-hook for the embedding: token ids -> padded rows.

    An id outside the vocabulary never reaches it: the range check that ``apply_tensor_parallel``
    registers first raises (tensor/layers.py, check_token_ids)."""

    def hook(module: nn.Module, args: tuple) -> tuple:
        return (padding.padded_ids(args[0]), *args[1:])

    return hook
