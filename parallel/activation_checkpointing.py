"""Activation checkpointing of the model's layers with ``torch.utils.checkpoint`` (names unchanged).

- ``full``: each layer keeps only its input; everything inside is recomputed in backward.
- ``selective``: inside each layer the outputs of matrix multiplies and attention are kept and the
  cheap element-wise work (norms, activations, dropout masks, adds) is recomputed, which saves most
  of the activation memory for a small part of the recompute cost.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from brickwork.errors import ConfigError

_aten = torch.ops.aten
_SAVED_OPS = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten.linear.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_cudnn_attention.default,
}


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """Checkpoint each module of ``model.layers`` in place; ``mode`` is none, full or selective."""
    if mode == "none":
        return
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(
            f"activation checkpointing needs a `layers` ModuleList; {type(model).__name__} has none",
            "activation_checkpointing",
        )
    for layer in layers:
        layer.forward = partial(_checkpointed, layer.forward, mode)


def _checkpointed(forward, mode: str, *args, **kwargs):
    # Wrapping the bound forward (not the module) keeps parameter names, and the hooks of the
    # layer itself (tensor-parallel layout changes) stay outside the recomputed region.
    options = {}
    if mode == "selective":
        options["context_fn"] = partial(create_selective_checkpoint_contexts, _save_matmuls)
    return checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)
