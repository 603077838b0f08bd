"""The hook through which a model brickwork did not build brings its tensor-parallel plan and its
pipeline recipe: a family found by the model's ``config.model_type``.

parallel/ holds no model-specific code. Each supported HF family declares, in its own module of
``brickwork.factory.hf``, how its models shard and split; ``parallelize(hf_model, dist)`` needs no
hand-written plan. The family registry is looked up when a model is laid out, not imported with this
module: the factory imports parallel/ (checkpoint reading, these plan types) when it loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from torch import nn

from brickwork.parallel.plans.model_plan import ModelPlan

if TYPE_CHECKING:
    from brickwork.parallel.pipeline_stages import StageRecipe


class ModelFamily(Protocol):
    """What parallel/ asks of a model family."""

    def tp_plan(self, model: nn.Module) -> ModelPlan:
        """The tensor-parallel plan of ``model`` (a base model or any of its task heads)."""
        ...

    def stage_recipe(self, model: nn.Module) -> StageRecipe:
        """How ``model`` splits into pipeline stages; ConfigError naming the class when it cannot."""
        ...


def model_family(model: nn.Module) -> ModelFamily | None:
    """The family of an HF model of a supported type; None for anything else (e.g. a brickwork model)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if not isinstance(model_type, str):
        return None
    from brickwork.factory.hf import FAMILIES  # at call time: the factory imports parallel/ at load

    return FAMILIES.get(model_type)


def plan_for(model: nn.Module) -> ModelPlan | None:
    """The tensor-parallel plan of an HF model of a supported family; None for anything else."""
    family = model_family(model)
    return family.tp_plan(model) if family is not None else None


__all__ = ["ModelFamily", "ModelPlan", "model_family", "plan_for"]
