"""Regional compilation: each layer of the model compiled on its own.

``torch.compile`` of a whole model traces one graph through every layer, so its compile time grows
with depth, and one graph break anywhere splits it. Compiling each layer alone (``fullgraph=True``: a
graph break is an error, not a silent slowdown) traces one layer's graph, which every identical layer
then reuses (dynamo treats a module's parameters as graph inputs). What stays eager between the
regions is the embedding, the final norm and the head's loss: a decoder's fused linear +
cross-entropy (kernels/linear_cross_entropy.py) computes every gradient in its forward pass from
aligned chunks, three matmuls a chunk, where the compiled form of the same loss must checkpoint its
chunks and recompute each chunk's logits in the backward pass, a fourth.

It runs after tensor parallel, expert parallel and activation checkpointing have changed the layers,
and before data parallel wraps them. The layer's forward is compiled, not its call, so hooks on the
layer itself (FSDP2's gathers, sequence parallel's split before the first layer) stay outside the
region and run once per call, as in eager mode. Layouts and layers that do not compile to eager's
numbers in one graph are refused by name (:func:`check_compilable`).
"""

from __future__ import annotations

import torch
from torch import nn

from brickwork.blocks.reversible import ReversibleLayers
from brickwork.components.feedforward.moe import MixtureOfExperts
from brickwork.errors import ConfigError
from brickwork.parallel.activation_checkpointing import layer_stacks
from brickwork.parallel.config import ParallelConfig

# Set on a model whose regions are compiled: TrainStep(compile=True) then has nothing left to do.
COMPILED_ATTR = "_brickwork_compiled"


def compile_regions(model: nn.Module) -> list[nn.Module]:
    """The modules compiled one by one: every layer of each stack (the model's ModuleList children,
    as activation checkpointing finds them)."""
    return [layer for stack in layer_stacks(model) for layer in stack]


def check_compilable(model: nn.Module, config: ParallelConfig | None = None) -> None:
    """ConfigError naming what keeps ``model`` (under ``config``) from compiling region by region."""
    stacks = layer_stacks(model)
    if not stacks:
        raise ConfigError(
            f"compile compiles each layer of the model's ModuleList children (such as `layers`); "
            f"{type(model).__name__} has none",
            "compile",
        )
    if any(isinstance(stack, ReversibleLayers) for stack in stacks):
        raise ConfigError(
            "a reversible stack recomputes its layers inside its own backward (a custom autograd "
            "function that replays RNG states), which torch.compile cannot trace as one graph per "
            "layer: train it with compile off",
            "compile",
        )
    if any(isinstance(module, MixtureOfExperts) for module in model.modules()):
        raise ConfigError(
            "mixture-of-experts layers route a data-dependent number of tokens to each expert, so "
            "their shapes change every step and a fullgraph region would recompile: train them with "
            "compile off",
            "compile",
        )
    if config is not None and config.context_parallel_size > 1:
        raise ConfigError(
            "context parallel's hooks inside each attention layer (the gather of keys and values over "
            "the cp ranks, the per-rank position offsets) do not compile to eager's gradients: train "
            "it with compile off, or context_parallel_size 1",
            "compile",
        )


def apply_compile(model: nn.Module, config: ParallelConfig | None = None) -> nn.Module:
    """Compile each region of ``model`` in place (:func:`compile_regions`) with ``fullgraph=True``;
    returns ``model``. Parameter and state-dict names are unchanged. A second call does nothing."""
    if getattr(model, COMPILED_ATTR, False):
        return model
    check_compilable(model, config)
    regions = compile_regions(model)
    # Layers of one class share its forward's cache of graphs in dynamo: one per distinct layer (options
    # set per layer differ), for training and for evaluation, and for every model compiled in this
    # process. Past the limit (8 by default) a fullgraph region fails, so a deep hybrid stack raises it.
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = max(limit, 4 * len(regions))
    for region in regions:
        # The forward, not the module call: hooks on the layer itself (FSDP2's gathers, sequence
        # parallel's split) stay outside the graph and run as they do in eager mode.
        region.forward = torch.compile(region.forward, fullgraph=True)
    setattr(model, COMPILED_ATTR, True)
    return model


def is_compiled(model: nn.Module) -> bool:
    """Whether :func:`apply_compile` compiled ``model``'s regions (a pipeline: each of its stages)."""
    return bool(getattr(model, COMPILED_ATTR, False))
