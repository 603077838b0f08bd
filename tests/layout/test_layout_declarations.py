"""The layout a model declares, read without parallel/: a plan's head counts refuse a tensor-parallel
size that would split a head, and a recipe numbers the layers of its stacks in forward order."""

from __future__ import annotations

import pytest
from torch import nn

from brickwork.errors import ConfigError
from brickwork.layout import ModelPlan, StageRecipe


def test_a_plan_refuses_a_tensor_parallel_size_that_would_split_a_head() -> None:
    plan = ModelPlan({"layers.*.attention": {"q": "colwise", "out": "rowwise"}}, heads={"num_heads": 6})
    plan.check(3)
    with pytest.raises(ConfigError, match="num_heads=6 is not divisible by tensor_parallel_size=4"):
        plan.check(4)


def test_a_recipe_numbers_the_layers_of_its_stacks_in_forward_order() -> None:
    class EncoderThenDecoder(StageRecipe):
        stacks = ("encoder", "decoder")

    model = nn.Module()
    model.encoder = nn.ModuleList(nn.Linear(2, 2) for _ in range(2))
    model.decoder = nn.ModuleList([nn.Linear(2, 2)])
    assert EncoderThenDecoder(model).units() == [("encoder", 0), ("encoder", 1), ("decoder", 0)]
