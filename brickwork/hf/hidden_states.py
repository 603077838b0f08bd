"""HF's ``output_hidden_states`` for a brickwork stack: the embedding output, then each layer's.

brickwork's stacks run their layers in one call (``run_layers``), so the states are read from hooks
on the layers for the length of one forward. As in HF's models, the last entry is the final-normed
output, the one the head reads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from brickwork.blocks.reversible import ReversibleLayers


@contextlib.contextmanager
def recording(layers: nn.ModuleList, final_norm: nn.Module, enabled: bool) -> Iterator[list[torch.Tensor]]:
    """While open, the list fills with the hidden states [B, T, d] of each forward through ``layers``
    and ``final_norm``: the input to the first layer, each layer's output, the last one normed.
    Nothing is recorded when not ``enabled``."""
    states: list[torch.Tensor] = []
    if not enabled:
        yield states
        return
    if isinstance(layers, ReversibleLayers):
        raise ValueError("output_hidden_states: a reversible stack has no output of its own per layer")
    handles = [layers[0].register_forward_pre_hook(lambda _m, args: states.append(args[0]))]
    handles += [layer.register_forward_hook(lambda _m, _a, out: states.append(out)) for layer in layers]
    handles.append(final_norm.register_forward_hook(lambda _m, _a, out: states.__setitem__(-1, out)))
    try:
        yield states
    finally:
        for handle in handles:
            handle.remove()
