"""Pipeline stages cut by hand from a model: a contiguous run of its layers per stage, plus the
modules around them that the stage's place needs (the embedding first, the head last).

A recipe (:class:`~brickwork.layout.StageRecipe`) says, for one kind of model, which layers are split,
which other modules a stage needs and how its run of layers computes; this module finds the recipe,
cuts the stages and runs each one's ``forward`` under the schedule. Recipes exist for

- models whose forward is ``head(layers(embed(x)))`` (brickwork's DecoderLM, Encoder and
  ImageEncoder, or a user's model with ``embed``, ``layers`` and ``head``);
- a model that declares its own recipe with a ``stage_recipe()`` method (brickwork's EncoderDecoder,
  split as Megatron splits T5, blocks/encoder_decoder.py);
- HF models, by the recipe their family module declares (``brickwork.factory.hf``), found through
  ``config.model_type``.

A stage registers the model's own modules under their own dotted names (layers keep their indices
in a ModuleList, parents are empty containers), so every parameter keeps the full model's name and a
stage's state dict is a slice of the model's. Between stages only hidden states travel (a tuple of
them in the decoder part); the batch's other inputs (``attention_mask``, ``token_type_ids``,
``decoder_input_ids``, a decoder's ``document_ids``) reach every stage as keyword arguments, which the
schedule splits into microbatches on every rank, since pipeline peers hold the same batch.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.blocks.inputs import padding_mask
from brickwork.blocks.reversible import ReversibleLayers
from brickwork.components.attention import DocumentMask
from brickwork.errors import ConfigError
from brickwork.layout import Stage, StageRecipe
from brickwork.parallel.balance import layer_costs, module_cost, split_stages
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.plans import model_family


class EmbedLayersHead(StageRecipe):
    """``head(layers(embed(x)))``: the modules ``embed`` and ``head`` call are found by running them
    once on a one-position input with hooks; top-level parameters (a ViT's class token) and children
    neither calls but that hold parameters go with the embedding, so none is lost."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.embed_names, self.head_names = _called_modules(model)
        self.embed_takes = set(inspect.signature(model.embed).parameters)

    def head_modules(self) -> list[str]:
        return self.head_names

    def outer_modules(self, units: Sequence[tuple[str, int]], first: bool, last: bool) -> list[str]:
        own = [name for name, _ in self.model.named_parameters(recurse=False)]
        return (self.embed_names + own if first else []) + (self.head_names if last else [])

    def run(self, stage: Stage, carried: tuple, extras: dict[str, torch.Tensor]) -> Any:
        shell = stage.shell
        h = carried[0]
        given = {k: v for k, v in extras.items() if k in self.embed_takes}
        if "document_ids" in extras:  # packed documents: one mask per stage, positions from it
            documents = DocumentMask(extras["document_ids"].to(h.device))
            given["positions"] = documents.positions()
            masked = {"attn_mask": documents, "positions": given["positions"]}
        else:
            mask = padding_mask("attention_mask", extras.get("attention_mask"), h.shape[:2])
            masked = {"attn_mask": mask} if mask is not None else {}
        if stage.is_first:
            h = shell.embed(h, **given)
        for layer in stage.get_submodule("layers"):
            h = layer(h, **masked)
        return shell.head(h) if stage.is_last else h


def stage_recipe(model: nn.Module) -> StageRecipe:
    """The recipe for ``model``; ConfigError naming what a pipeline needs when none fits, or for a
    reversible stack: its blocks run as one coupled function, not one by one."""
    recipe = _recipe_for(model)
    for stack in recipe.stacks:
        if isinstance(model.get_submodule(stack), ReversibleLayers):
            raise ConfigError(
                f"pipeline parallel cannot split the reversible stack {stack!r}: its blocks are coupled "
                "(each reads two streams), so a run of them is not a stage; build it with reversible: false",
                "pipeline_parallel_size",
            )
    return recipe


def _recipe_for(model: nn.Module) -> StageRecipe:
    family = model_family(model)  # an HF model: its family module holds the recipe
    if family is not None:
        return family.stage_recipe(model)
    declared = getattr(model, "stage_recipe", None)  # a model with a forward of another shape
    if callable(declared):
        return declared()
    if not (callable(getattr(model, "embed", None)) and callable(getattr(model, "head", None))):
        raise ConfigError(
            "pipeline parallel splits a model whose forward is head(layers(embed(x))), one that "
            "declares its stage_recipe(), or an HF model of a supported family (brickwork.factory.hf); "
            f"{type(model).__name__} is none of them (it lacks embed or head)",
            "pipeline_parallel_size",
        )
    if not isinstance(getattr(model, "layers", None), nn.ModuleList):
        raise ConfigError(
            f"pipeline parallel needs the model's `layers` ModuleList, which {type(model).__name__} lacks",
            "pipeline_parallel_size",
        )
    return EmbedLayersHead(model)


def stage_layer_counts(model: nn.Module, config: ParallelConfig) -> tuple[int, ...]:
    """Layers per stage (all pp × v stages, in stage order): explicit ``pipeline_layers`` or balanced.

    Raises ConfigError, naming the numbers, when the layers cannot fill the stages.
    """
    recipe = stage_recipe(model)
    units = recipe.units()
    n, stages = len(units), config.num_stages
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
    weights = None
    if config.device_weights is not None and config.pipeline_parallel_size > 1:
        pp = config.pipeline_parallel_size
        weights = [config.device_weights[s % pp] for s in range(stages)]
    costs, head = balance_costs(model, recipe)
    return split_stages(costs, stages, weights, last_extra=head)


def balance_costs(model: nn.Module, recipe: StageRecipe) -> tuple[tuple[float, ...], float]:
    """What the stages are balanced on (parallel/balance.py): each layer's cost per token at the
    model's longest sequence (its ``max_seq_len``, else 1024), and the head's, which the last stage
    adds. The planner places its stages on the same numbers (parallel/planner/model_facts.py)."""
    model_config = getattr(model, "config", None)
    seq_len = (
        getattr(model, "max_seq_len", None)
        or getattr(model, "seq_len", None)
        or getattr(model_config, "max_position_embeddings", None)
        or 1024
    )
    layers = [model.get_submodule(stack)[i] for stack, i in recipe.units()]
    # An embedding lookup does no matmul: only the head adds to its stage's cost.
    head = sum(module_cost(model.get_submodule(name), seq_len) for name in recipe.head_modules())
    return tuple(layer_costs(layers, seq_len)), head


@torch.no_grad()
def _called_modules(model: nn.Module) -> tuple[list[str], list[str]]:
    """Names of the top-level children that ``embed`` and ``head`` call (besides ``layers``)."""
    children = {name: child for name, child in model.named_children() if name != "layers"}
    called: list[str] = []
    hooks = [
        child.register_forward_pre_hook(lambda module, args, name=name: called.append(name))
        for name, child in children.items()
    ]
    try:
        h = model.embed(_sample_input(model))
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


def _sample_input(model: nn.Module) -> torch.Tensor:
    """One input of the first stage: what the model declares (``example_input()``, an image encoder's
    one image), else one token id."""
    declared = getattr(model, "example_input", None)
    if callable(declared):
        return declared()
    return torch.zeros(1, 1, dtype=torch.long, device=next(model.parameters()).device)


class PipelineStageModule(nn.Module):
    """One stage: ``forward(*carried, **extras)`` runs its recipe on its run of layers.

    Input: the first stage's batch input (token ids [B, T], images [B, C, H, W]), else the previous
    stage's outputs; ``extras`` are the batch's other inputs. Output: hidden states (a tuple in an
    encoder-decoder's decoder part), or on the last stage the logits as a plain tensor: under tensor
    parallel their local vocabulary shard, whose layout is kept in ``output_layout`` for the loss.
    """

    def __init__(
        self,
        model: nn.Module,
        recipe: StageRecipe,
        stage_index: int,
        num_stages: int,
        units: Sequence[tuple[str, int]],
    ) -> None:
        super().__init__()
        self.stage_index, self.num_stages = stage_index, num_stages
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        self.units = list(units)
        self._recipe = [recipe]  # lists: not registered, so names stay the model's
        for name in recipe.outer_modules(self.units, self.is_first, self.is_last):
            _graft(self, model, name, _module_or_parameter(model, name))
        for stack, i in self.units:
            _graft(self, model, f"{stack}.{i}", model.get_submodule(stack)[i])
        # A brickwork model's own methods run on a shallow copy that sees this stage's modules and
        # parameters only (the same dicts, so what TP or FSDP puts in the stage is what it sees).
        shell = copy.copy(model)
        shell._modules, shell._parameters = self._modules, self._parameters
        self._shell = [shell]
        self._model_plan = model.tp_plan() if callable(getattr(model, "tp_plan", None)) else {}
        self.output_layout: tuple | None = None

    @property
    def shell(self) -> nn.Module:
        return self._shell[0]

    def tp_plan(self) -> dict[str, str]:
        """The model's own plan, for the modules this stage holds."""
        names = dict(self.named_modules())
        return {path: style for path, style in self._model_plan.items() if path in names}

    def forward(self, *carried: torch.Tensor, **extras: torch.Tensor) -> Any:
        out = self._recipe[0].run(self, carried, extras)
        if self.is_last and isinstance(out, DTensor):
            self.output_layout = (out.device_mesh, out.placements, out.shape, out.stride())
            out = out.to_local()
        return out


def _module_or_parameter(model: nn.Module, name: str) -> nn.Module | nn.Parameter:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return model.get_parameter(name)


def _graft(stage: nn.Module, model: nn.Module, path: str, item: nn.Module | nn.Parameter) -> None:
    """Register ``item`` in ``stage`` at ``path``, making empty parents (ModuleLists for layer
    lists) as needed, so its name there is its name in ``model``."""
    *parents, leaf = path.split(".")
    here, source = stage, model
    for part in parents:
        source = source.get_submodule(part)
        if part not in here._modules:
            here.add_module(part, nn.ModuleList() if isinstance(source, nn.ModuleList) else nn.Module())
        here = here._modules[part]
    if isinstance(item, nn.Parameter):
        here.register_parameter(leaf, item)
    else:
        here.add_module(leaf, item)


def build_stage_modules(
    model: nn.Module, counts: Sequence[int], stage_ids: Sequence[int]
) -> list[PipelineStageModule]:
    """The stages ``stage_ids`` of ``model`` split into ``counts`` layers per stage."""
    recipe = stage_recipe(model)
    units = recipe.units()
    starts = [sum(counts[:s]) for s in range(len(counts))]
    return [
        PipelineStageModule(model, recipe, s, len(counts), units[starts[s] : starts[s] + counts[s]])
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
