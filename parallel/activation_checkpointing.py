"""Activation checkpointing of the model's layers with ``torch.utils.checkpoint`` (names unchanged).

- ``full``: each layer keeps only its input; everything inside is recomputed in backward.
- ``selective``: inside each layer the outputs of matrix multiplies, attention and tensor-parallel
  reductions are kept and the cheap element-wise work (norms, activations, dropout masks, adds) is
  recomputed, which saves most of the activation memory for a small part of the recompute cost.
  The recomputation replays a layer's forward, so what it does not keep of its collectives (the
  all-gathers of sequence parallel, context parallel's keys and values, expert parallel's
  all-to-alls) runs again.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from brickwork.errors import ConfigError
from brickwork.parallel.config import ParallelConfig

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
if torch.distributed.is_available():
    # A tensor-parallel reduction's output (the residual's share, 1/tp of the width under sequence
    # parallel) is small to keep, and a recomputation that replays it pays for the collective again.
    _SAVED_OPS |= {
        torch.ops._c10d_functional.reduce_scatter_tensor.default,
        torch.ops._c10d_functional.all_reduce.default,
    }


def _save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def layer_stacks(model: nn.Module) -> list[nn.ModuleList]:
    """The model's stacks of layers: its ModuleList children (``layers``; an encoder-decoder's
    ``encoder_layers`` and ``decoder_layers``), per docs/architecture.md's module tree."""
    return [child for child in model.children() if isinstance(child, nn.ModuleList)]


def apply_activation_checkpointing(model: nn.Module, config: ParallelConfig) -> nn.Module:
    """Checkpoint each layer of every stack of ``model`` in place, as ``activation_checkpointing``
    says (none, full or selective); returns ``model``."""
    mode = config.activation_checkpointing
    if mode == "none":
        return model
    stacks = layer_stacks(model)
    if not stacks:
        raise ConfigError(
            f"activation checkpointing needs the model's layers in a ModuleList child (such as `layers`); "
            f"{type(model).__name__} has none",
            "activation_checkpointing",
        )
    for layer in (layer for stack in stacks for layer in stack):
        layer.forward = partial(_checkpointed, layer.forward, mode)
    return model


def _checkpointed(forward, mode: str, *args, **kwargs):
    # Wrapping the bound forward (not the module) keeps parameter names, and the hooks of the
    # layer itself (tensor-parallel layout changes) stay outside the recomputed region.
    options = {}
    if mode == "selective":
        options["context_fn"] = partial(create_selective_checkpoint_contexts, _save_matmuls)
    return checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)
