"""Tensor-parallel plans for unmodified HF models, picked by the model's ``config.model_type``.

One file per model family. Each gives the glob plan (module-name pattern -> style) and the
attributes to divide by the TP size for that family's module names, for the base model and for its
task heads alike (the patterns follow the prefix the model actually has), so
``parallelize(hf_model, dist)`` needs no hand-written plan.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from brickwork.parallel.plans.bert import bert_plan
from brickwork.parallel.plans.gpt2 import gpt2_plan
from brickwork.parallel.plans.gpt_neox import gpt_neox_plan
from brickwork.parallel.plans.llama import llama_plan
from brickwork.parallel.plans.model_plan import ModelPlan

PLANS: dict[str, Callable[[nn.Module], ModelPlan]] = {
    "bert": bert_plan,
    "gpt2": gpt2_plan,
    "gpt_neox": gpt_neox_plan,
    "llama": llama_plan,
}


def plan_for(model: nn.Module) -> ModelPlan | None:
    """The plan for an HF model of a supported family; None for anything else (e.g. a brickwork model)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    make = PLANS.get(model_type) if isinstance(model_type, str) else None
    return make(model) if make is not None else None


__all__ = ["PLANS", "ModelPlan", "plan_for"]
