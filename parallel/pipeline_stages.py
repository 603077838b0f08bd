"""Pipeline stages cut by hand from a model that exposes ``embed``, ``layers`` and ``head``.

Stage *s* of *S* holds a contiguous run of ``model.layers``; the first stage also holds the modules
``embed`` calls, the last those ``head`` calls. A stage registers the model's own child modules
under their own names (the layers keep their indices in a ModuleList), so every parameter keeps the
full model's name and a stage's state dict is a slice of the model's. Which top-level modules
``embed`` and ``head`` use is found by running them once on a one-token input with hooks, so no
model-specific code is needed (docs/architecture.md: ``forward`` is ``head(layers(embed(ids)))``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.errors import ConfigError
from brickwork.parallel.balance import layer_costs, module_cost, split_stages
from brickwork.parallel.config import ParallelConfig


def check_pipeline_model(model: nn.Module) -> nn.ModuleList:
    """The model's ``layers``; ConfigError unless it has ``embed``, ``head`` and a ``layers`` ModuleList."""
    layers = getattr(model, "layers", None)
    if not (callable(getattr(model, "embed", None)) and callable(getattr(model, "head", None))):
        raise ConfigError(
            "pipeline parallel splits a model whose forward is head(layers(embed(x))); "
            f"{type(model).__name__} lacks embed or head (encoder-decoder and HF models are not "
            "pipelined: see the task x layout table of docs/training.md)",
            "pipeline_parallel_size",
        )
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(
            f"pipeline parallel needs the model's `layers` ModuleList, which {type(model).__name__} lacks",
            "pipeline_parallel_size",
        )
    if any(True for _ in model.parameters(recurse=False)):
        raise ConfigError(
            "pipeline parallel needs every parameter inside a child module, but "
            f"{type(model).__name__} holds {[n for n, _ in model.named_parameters(recurse=False)]} "
            "itself (e.g. a ViT class token)",
            "pipeline_parallel_size",
        )
    return layers


def stage_layer_counts(model: nn.Module, config: ParallelConfig) -> tuple[int, ...]:
    """Layers per stage (all pp × v stages, in stage order): explicit ``pipeline_layers`` or balanced.

    Raises ConfigError, naming the numbers, when the layers cannot fill the stages.
    """
    layers = check_pipeline_model(model)
    n, stages = len(layers), config.num_stages
    if config.pipeline_num_layers is not None and config.pipeline_num_layers != n:
        raise ConfigError(
            f"pipeline_num_layers={config.pipeline_num_layers} but the model has {n} layers",
            "pipeline_num_layers",
        )
    if n < stages:
        raise ConfigError(
            f"the model has {n} layers, fewer than the {stages} stages (pipeline_parallel_size "
            f"{config.pipeline_parallel_size} × virtual_pipeline_size {config.virtual_pipeline_size}); "
            "every stage needs at least one layer",
            "pipeline_parallel_size",
        )
    if config.pipeline_layers is not None:
        if sum(config.pipeline_layers) != n:
            raise ConfigError(
                f"sums to {sum(config.pipeline_layers)} layers but the model has {n}", "pipeline_layers"
            )
        return tuple(config.pipeline_layers)
    seq_len = getattr(model, "max_seq_len", None) or getattr(model, "seq_len", None) or 1024
    # An embedding lookup does no matmul: only the head adds to its stage's cost.
    _, head_names = outer_modules(model)
    head_cost = sum(module_cost(getattr(model, name), seq_len) for name in head_names)
    weights = None
    if config.device_weights is not None and config.pipeline_parallel_size > 1:
        pp = config.pipeline_parallel_size
        weights = [config.device_weights[s % pp] for s in range(stages)]
    return split_stages(layer_costs(list(layers), seq_len), stages, weights, last_extra=head_cost)


@torch.no_grad()
def outer_modules(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names of the top-level children that ``embed`` and ``head`` call (the rest of ``layers``).

    Children that neither calls but that hold parameters go with ``embed``, so none is lost.
    """
    children = {name: child for name, child in model.named_children() if name != "layers"}
    called: list[str] = []
    hooks = [
        child.register_forward_pre_hook(lambda module, args, name=name: called.append(name))
        for name, child in children.items()
    ]
    try:
        device = next(model.parameters()).device
        h = model.embed(torch.zeros(1, 1, dtype=torch.long, device=device))
        embed_names = list(dict.fromkeys(called))
        called.clear()
        model.head(h)
        head_names = list(dict.fromkeys(called))
    finally:
        for hook in hooks:
            hook.remove()
    for name, child in children.items():
        if name not in embed_names and name not in head_names and any(True for _ in child.parameters()):
            embed_names.append(name)
    return embed_names, head_names


class PipelineStageModule(nn.Module):
    """One stage: ``forward(x)`` is embed (first stage) → its layers → head (last stage).

    Input: token ids [B, T] on the first stage, else the previous stage's hidden states. Output: the
    hidden states, or on the last stage the logits as a plain tensor: under tensor parallel their
    local vocabulary shard, whose layout is kept in ``output_layout`` for the loss.
    """

    def __init__(
        self,
        model: nn.Module,
        stage_index: int,
        num_stages: int,
        layer_ids: Sequence[int],
        embed_names: Sequence[str],
        head_names: Sequence[str],
    ) -> None:
        super().__init__()
        self.stage_index, self.num_stages = stage_index, num_stages
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        names = (list(embed_names) if self.is_first else []) + (list(head_names) if self.is_last else [])
        for name in dict.fromkeys(names):
            self.add_module(name, getattr(model, name))
        layers = nn.ModuleList()
        for i in layer_ids:
            layers.add_module(str(i), model.layers[i])
        self.add_module("layers", layers)
        # The model's embed/head run on a shallow copy that sees this stage's modules only.
        shell = copy.copy(model)
        shell._modules = self._modules
        self._shell = [shell]  # a list: not registered, so names stay the model's
        self._model_plan = model.tp_plan() if callable(getattr(model, "tp_plan", None)) else {}
        self.output_layout: tuple | None = None

    def tp_plan(self) -> dict[str, str]:
        """The model's own plan, for the modules this stage holds."""
        names = dict(self.named_modules())
        return {path: style for path, style in self._model_plan.items() if path in names}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shell = self._shell[0]
        h = shell.embed(x) if self.is_first else x
        for layer in self.layers:
            h = layer(h)
        if not self.is_last:
            return h
        logits = shell.head(h)
        if isinstance(logits, DTensor):
            self.output_layout = (logits.device_mesh, logits.placements, logits.shape, logits.stride())
            logits = logits.to_local()
        return logits


def build_stage_modules(
    model: nn.Module, counts: Sequence[int], stage_ids: Sequence[int]
) -> list[PipelineStageModule]:
    """The stages ``stage_ids`` of ``model`` split into ``counts`` layers per stage."""
    embed_names, head_names = outer_modules(model)
    starts = [sum(counts[:s]) for s in range(len(counts))]
    return [
        PipelineStageModule(
            model, s, len(counts), range(starts[s], starts[s] + counts[s]), embed_names, head_names
        )
        for s in stage_ids
    ]


def shared_parameters(model: nn.Module, counts: Sequence[int]) -> list[dict[int, str]]:
    """Parameters that several stages hold (tied embeddings): for each, {stage index: its name there}."""
    stages = build_stage_modules(model, counts, range(len(counts)))
    holders: dict[int, dict[int, str]] = {}
    for stage in stages:
        for name, param in stage.named_parameters(remove_duplicate=False):
            holders.setdefault(id(param), {}).setdefault(stage.stage_index, name)
    return [held for held in holders.values() if len(held) > 1]
