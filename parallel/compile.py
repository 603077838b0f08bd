"""Regional compilation: each layer of the model compiled on its own, plus its head and loss.

``torch.compile`` of a whole model traces one graph through every layer, so its compile time grows
with depth, and one graph break anywhere splits it. Compiling each layer alone (``fullgraph=True``: a
graph break is an error, not a silent slowdown) traces one layer's graph, which every identical layer
then reuses (dynamo treats a module's parameters as graph inputs), and the model's head and loss are
compiled as one more region (:func:`compile_regions`). What stays eager between regions is the
embedding and the Python that walks the layers.

It runs after tensor parallel, expert parallel and activation checkpointing have changed the
layers, and before data parallel wraps them: FSDP2's hooks and DDP's reducer stay outside the
compiled regions, as torch's own distributed compile recipe has them. Layouts whose collectives run
inside a layer and cannot be traced into a graph are refused by name (:func:`check_compilable`).
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
    """The modules compiled one by one: every layer of each stack (the ModuleList children, as
    activation checkpointing finds them), then what the model names as its head regions
    (``model.head_regions()``: the final norm, the output head, the loss module)."""
    layers = [layer for stack in layer_stacks(model) for layer in stack]
    head_regions = getattr(model, "head_regions", None)
    return layers + (list(head_regions()) if callable(head_regions) else [])


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
    for region in compile_regions(model):
        # The forward, not the module call: hooks on the region itself (FSDP2's, sequence parallel's
        # split before the first layer) stay outside, where they run once per call as in eager mode.
        # A graph compiled with one layer's own hooks inside would be reused by layers without them.
        region.forward = torch.compile(region.forward, fullgraph=True)
    setattr(model, COMPILED_ATTR, True)
    return model


def is_compiled(model: nn.Module) -> bool:
    """Whether :func:`apply_compile` compiled ``model``'s regions (a pipeline: each of its stages)."""
    return bool(getattr(model, COMPILED_ATTR, False))
