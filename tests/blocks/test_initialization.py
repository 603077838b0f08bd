"""Init schemes: the spread of each weight family, against the formulas they implement."""

import math

import pytest
import torch
from factory_specs import tiny_decoder

from brickwork.components.residual import deepnorm_coefficients
from brickwork.factory import build_model


def wide_decoder(init: dict, residual: str = "pre") -> dict:
    spec = tiny_decoder()
    spec.update(dim_model=64, vocab_size=512, init=init)
    spec["decoder"]["block"].update(residual=residual, feedforward={"name": "mlp", "hidden_dim": 256})
    spec["decoder"]["block"]["attention"]["fused_qkv"] = False
    return spec


def std(t: torch.Tensor) -> float:
    return t.detach().double().std().item()


def test_normal_with_scaled_residual_outputs() -> None:
    torch.manual_seed(0)
    model = build_model(wide_decoder({"name": "normal", "std": 0.05, "scaled_residual": True}))
    layer = model.layers[0]
    assert std(model.token_embedding.weight) == pytest.approx(0.05, rel=0.05)
    assert std(layer.attention.q_proj.weight) == pytest.approx(0.05, rel=0.05)
    assert std(layer.feedforward.down_proj.weight) == pytest.approx(0.05 / math.sqrt(2 * 3), rel=0.05)
    assert torch.count_nonzero(layer.attention.q_proj.bias) == 0
    assert torch.equal(layer.attention_norm.weight, torch.ones(64))


def test_small_init_and_xavier() -> None:
    torch.manual_seed(0)
    layer = build_model(wide_decoder({"name": "small_init"})).layers[0]
    assert std(layer.feedforward.up_proj.weight) == pytest.approx(math.sqrt(2 / (5 * 64)), rel=0.05)
    torch.manual_seed(0)
    model = build_model(wide_decoder({"name": "xavier", "gain": 2.0}))
    up = model.layers[0].feedforward.up_proj.weight  # [256, 64]
    assert std(up) == pytest.approx(2.0 * math.sqrt(2 / (64 + 256)), rel=0.05)
    assert std(model.token_embedding.weight) == pytest.approx(64**-0.5, rel=0.05)


def test_none_keeps_pytorch_defaults() -> None:
    torch.manual_seed(0)
    weight = build_model(wide_decoder({"name": "none"})).layers[0].feedforward.up_proj.weight
    bound = 1 / math.sqrt(64)  # nn.Linear's kaiming-uniform bound
    assert weight.abs().max().item() <= bound and std(weight) == pytest.approx(bound / math.sqrt(3), rel=0.05)


def test_deepnorm_blocks_scale_values_outputs_and_feedforward_by_beta() -> None:
    torch.manual_seed(0)
    model = build_model(wide_decoder({"name": "normal", "std": 0.05}, residual="deepnorm"))
    _, beta = deepnorm_coefficients(0, 3, "decoder")
    layer = model.layers[0]
    assert std(layer.attention.q_proj.weight) == pytest.approx(0.05, rel=0.05)
    for weight in (
        layer.attention.v_proj.weight,
        layer.attention.out_proj.weight,
        layer.feedforward.up_proj.weight,
    ):
        assert std(weight) == pytest.approx(0.05 * beta, rel=0.07)
