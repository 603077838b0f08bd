"""How a model declares its parallel layout, as data: a tensor-parallel plan (:class:`ModelPlan`, the
glob form of the ``tp_plan()`` dicts components declare) and a pipeline recipe (:class:`StageRecipe`:
which layers are split and what each stage computes); and a vocabulary padded inside the model
(``vocab_padding.py``: the model's own ``vocab_multiple``, which tensor parallel lays out again).

It sits below the factory and parallel/: the HF family modules (``brickwork.factory.hf``) declare
their models' layouts with these types, and parallel/ applies them (``parallel/tensor/``,
``parallel/pipeline/``) without knowing any model.
"""

from brickwork.layout.model_plan import ModelPlan, PlanValue
from brickwork.layout.stage_recipe import Stage, StageRecipe

__all__ = ["ModelPlan", "PlanValue", "Stage", "StageRecipe"]
