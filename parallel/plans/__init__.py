"""Tensor-parallel plans and pipeline recipes of models brickwork did not build, found by model type.

parallel/ holds no model-specific code. Each supported HF family declares, in its own module of
``brickwork.factory.hf``, how its models shard (a :class:`ModelPlan`) and split into pipeline stages,
so ``parallelize(hf_model, dist)`` needs no hand-written plan. :func:`model_family` finds the family
by the model's ``config.model_type`` when a model is laid out, not when this module is imported:
the factory imports parallel/ (checkpoint reading, these types) when it loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from torch import nn

from brickwork.errors import ConfigError
from brickwork.parallel.tensor.plan import PlanValue

if TYPE_CHECKING:
    from brickwork.parallel.pipeline.stages import StageRecipe


@dataclass(frozen=True)
class ModelPlan:
    """``plan``: module-name glob -> style, or -> {child: style} for the modules owning those children
    (see :func:`~brickwork.parallel.tensor.plan.name_plan`); ``divide``: module glob -> integer
    attributes divided by tp.

    ``heads``: head counts that must divide by the TP size ({"num_key_value_heads": 4}) when no
    module attribute carries them, so a split that would cut a head in two is refused by name.
    """

    plan: Mapping[str, PlanValue]
    divide: Mapping[str, list[str]] = field(default_factory=dict)
    heads: Mapping[str, int] = field(default_factory=dict)

    def check(self, tp: int) -> None:
        """ConfigError naming the head count that ``tp`` does not divide."""
        for name, count in self.heads.items():
            if count % tp:
                raise ConfigError(
                    f"{name}={count} is not divisible by tensor_parallel_size={tp}: a head would be split",
                    "tensor_parallel_size",
                )


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
    from brickwork.factory.hf import FAMILIES  # at call time: the factory imports parallel/ at load

    return FAMILIES.get(model_type)


def plan_for(model: nn.Module) -> ModelPlan | None:
    """The tensor-parallel plan of an HF model of a supported family; None for anything else."""
    family = model_family(model)
    return family.tp_plan(model) if family is not None else None


__all__ = ["ModelFamily", "ModelPlan", "model_family", "plan_for"]
