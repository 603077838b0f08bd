"""Tensor-parallel plans and pipeline recipes of models brickwork did not build, found by model type.

parallel/ holds no model-specific code. Each supported HF family declares, in its own module of
``brickwork.factory.hf``, how its models shard (a :class:`~brickwork.layout.ModelPlan`) and split into
pipeline stages (a :class:`~brickwork.layout.StageRecipe`), so ``parallelize(hf_model, dist)`` needs
no hand-written plan. :func:`model_family` finds the family by the model's ``config.model_type``.
"""

from __future__ import annotations

from typing import Protocol

from torch import nn

from brickwork.factory.hf import FAMILIES
from brickwork.layout import ModelPlan, StageRecipe


class ModelFamily(Protocol):
    """What parallel/ asks of a family: the plan of one of its models (base model or task head), and
    its stage recipe (ConfigError naming the class when it has none)."""

    def tp_plan(self, model: nn.Module) -> ModelPlan: ...

    def stage_recipe(self, model: nn.Module) -> StageRecipe: ...


def model_family(model: nn.Module) -> ModelFamily | None:
    """The family of an HF model of a supported type; None for anything else (e.g. a brickwork model)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not isinstance(model_type, str):
        return None
    return FAMILIES.get(model_type)


def plan_for(model: nn.Module) -> ModelPlan | None:
    """The tensor-parallel plan of an HF model of a supported family; None for anything else."""
    family = model_family(model)
    return family.tp_plan(model) if family is not None else None


__all__ = ["ModelFamily", "model_family", "plan_for"]
