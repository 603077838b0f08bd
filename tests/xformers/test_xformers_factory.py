"""xformers' block and model factory (ported from xformers' test_block_factory, test_model_factory,
test_hierarchical_transformer, test_pickling, test_reversible and test_pytorch_transformer_parity).

The block grid (attention x feedforward x activation x norm style x ...) has thousands of cases: it is
sampled deterministically so that every attention, feedforward, activation and norm style appears."""

from __future__ import annotations

import copy
import itertools
import pickle
import random
from contextlib import nullcontext

import pytest
import torch

from brickwork.xformers.components import Activation
from brickwork.xformers.components.attention import ATTENTION_REGISTRY, AttentionMask
from brickwork.xformers.components.feedforward import FEEDFORWARD_REGISTRY
from brickwork.xformers.factory import (
    xFormer,
    xFormerConfig,
    xFormerDecoderBlock,
    xFormerDecoderConfig,
    xFormerEncoderBlock,
    xFormerEncoderConfig,
    xFormerWeightInit,
)
from brickwork.xformers.helpers.hierarchical_configs import BasicLayerConfig, get_hierarchical_configuration

BATCH, SEQ, MODEL, VOCAB = 2, 64, 64, 64
ACTIVATIONS = [a.value for a in Activation]


def _grid(step: int, *axes: list) -> list[tuple]:
    """One in ``step`` combinations of ``axes``, drawn with a fixed seed (the same cases every run)."""
    grid = list(itertools.product(*axes))
    return random.Random(0).sample(grid, len(grid) // step)


def _attention(name: str, heads: int, causal: bool) -> dict:
    return {
        "name": name,
        "dropout": 0.1,
        "causal": causal,
        "window_size": SEQ // 8 + 1,
        "seq_len": SEQ,
        "attention_query_mask": torch.rand((SEQ, 1)) < 0.1,
        "dim_model": MODEL,
        "num_heads": heads,
        "dim_head": MODEL // heads,
        "layout": torch.eye(SEQ // 16, SEQ // 16, dtype=torch.long),
        "block_size": 16,
        "num_rules": 2,
    }


def _feedforward(name: str, activation: str) -> dict:
    return {
        "name": name,
        "dim_model": MODEL,
        "dropout": 0.5,
        "activation": activation,
        "hidden_layer_multiplier": 4,
        "number_of_experts": 4,
        "gate": "top_2",
    }


SINE = {"name": "sine", "dim_model": MODEL, "seq_len": SEQ, "vocab_size": VOCAB}
ATTENTIONS, FEEDFORWARDS = sorted(ATTENTION_REGISTRY), sorted(FEEDFORWARD_REGISTRY)


@pytest.mark.parametrize(
    ("attention", "feedforward", "heads", "activation", "style", "reversible"),
    _grid(24, ATTENTIONS, FEEDFORWARDS, [1, 2], ACTIVATIONS, ["pre", "post", "deepnorm"], [True, False]),
)
def test_encoder_block(
    attention: str, feedforward: str, heads: int, activation: str, style: str, reversible: bool
) -> None:
    config = xFormerEncoderConfig(
        dim_model=MODEL,
        feedforward_config=_feedforward(feedforward, activation),
        position_encoding_config=SINE,
        multi_head_config={
            "num_heads": heads,
            "dim_model": MODEL,
            "residual_dropout": 0.1,
            "attention": _attention(attention, heads, False),
        },
        residual_norm_style=style,
        reversible=reversible,
    )
    block = xFormerEncoderBlock.from_config(config)
    inputs = torch.rand(BATCH, SEQ)
    assert block(inputs).shape == (BATCH, SEQ, MODEL)
    mask_tensor = torch.ones(SEQ, SEQ, dtype=torch.bool)
    if block.supports_attention_mask:
        # An all-true mask changes nothing (dropout off to compare).
        block.eval()
        torch.testing.assert_close(
            block(inputs, att_mask=AttentionMask.from_bool(mask_tensor)), block(inputs)
        )
        torch.testing.assert_close(block(inputs, att_mask=mask_tensor), block(inputs))
    else:
        with pytest.raises(AssertionError):
            block(inputs, att_mask=AttentionMask.from_bool(mask_tensor))
    input_mask = torch.randn(SEQ)
    input_mask[input_mask < 0.0] = -float("inf")
    assert block(inputs, input_mask=input_mask).shape == (BATCH, SEQ, MODEL)


@pytest.mark.parametrize(
    ("attention", "feedforward", "heads", "activation", "style", "causal", "rotary"),
    _grid(
        48,
        ATTENTIONS,
        FEEDFORWARDS,
        [1, 2],
        ACTIVATIONS,
        ["pre", "post", "deepnorm"],
        [True, False],
        [False, True],
    ),
)
def test_decoder_block(
    attention: str, feedforward: str, heads: int, activation: str, style: str, causal: bool, rotary: bool
) -> None:
    mha = {
        "num_heads": heads,
        "dim_model": MODEL,
        "residual_dropout": 0.1,
        "use_rotary_embeddings": rotary,
        "attention": _attention(attention, heads, causal),
    }
    ff = _feedforward(feedforward, activation)
    encoder = xFormerEncoderBlock.from_config(
        xFormerEncoderConfig(
            dim_model=MODEL,
            multi_head_config=mha,
            feedforward_config=ff,
            position_encoding_config=SINE,
            residual_norm_style=style,
        )
    )
    decoder = xFormerDecoderBlock.from_config(
        xFormerDecoderConfig(
            dim_model=MODEL,
            multi_head_config_masked=mha,
            multi_head_config_cross=mha,
            feedforward_config=ff,
            position_encoding_config=SINE,
            residual_norm_style=style,
        )
    )
    inputs = torch.rand(BATCH, SEQ)
    encoded = encoder(inputs)
    assert decoder(inputs, encoded).shape == (BATCH, SEQ, MODEL)
    if decoder.supports_attention_mask:
        input_mask = torch.randn(SEQ)
        input_mask[input_mask < 0.0] = -float("inf")
        mask = torch.ones(SEQ, SEQ, dtype=torch.bool)
        decoder(inputs, encoded, encoder_att_mask=AttentionMask.from_bool(mask), input_mask=input_mask)
        decoder(inputs, encoded, encoder_att_mask=mask, input_mask=input_mask)
    shorter_ok = not decoder.requires_same_k_q_dimensions and not decoder.requires_squared_context_length
    if shorter_ok and not (causal and decoder.causal_attention):
        assert decoder(inputs[:, :-16], encoded).shape == (BATCH, SEQ - 16, MODEL)
    else:
        with pytest.raises(AssertionError):
            decoder(inputs[:, :-16], encoded)


def _base_encoder(**overrides: object) -> dict:
    config = {
        "dim_model": MODEL,
        "residual_norm_style": "pre",
        "reversible": False,
        "multi_head_config": {
            "num_heads": 2,
            "dim_model": MODEL,
            "residual_dropout": 0.1,
            "attention": _attention("scaled_dot_product", 2, False),
        },
        "feedforward_config": _feedforward("MLP", "relu"),
        "position_encoding_config": dict(SINE),
    }
    config.update(overrides)
    return config


def test_embedding_projection() -> None:
    block = xFormerEncoderBlock.from_config(
        xFormerEncoderConfig(**_base_encoder(position_encoding_config={**SINE, "dim_model": 2 * MODEL}))
    )
    inputs = torch.rand(BATCH, SEQ)
    assert block(inputs).shape == (BATCH, SEQ, MODEL)
    assert block(inputs, att_mask=torch.ones(SEQ, SEQ, dtype=torch.bool)).shape == (BATCH, SEQ, MODEL)


def test_simplicial_embedding() -> None:
    block = xFormerEncoderBlock.from_config(
        xFormerEncoderConfig(**_base_encoder(simplicial_embeddings={"L": 4}))
    )
    out = block(torch.rand(BATCH, SEQ))
    # Each of the 4 chunks is a probability vector.
    torch.testing.assert_close(out.reshape(BATCH, SEQ, 4, -1).sum(-1), torch.ones(BATCH, SEQ, 4))
    with pytest.raises(AssertionError):
        xFormerEncoderBlock.from_config(
            xFormerEncoderConfig(**_base_encoder(simplicial_embeddings={"L": 3}))
        )(torch.rand(BATCH, SEQ))


EMB, SEQ_M, VOC = 16, 16, 16
ENCODER = {
    "reversible": False,
    "block_type": "encoder",
    "dim_model": EMB,
    "residual_norm_style": "pre",
    "num_layers": 3,
    "position_encoding_config": {"name": "vocab", "seq_len": SEQ_M, "vocab_size": VOC, "dim_model": EMB},
    "multi_head_config": {
        "num_heads": 4,
        "residual_dropout": 0,
        "dim_model": EMB,
        "attention": {"name": "scaled_dot_product", "dropout": 0, "causal": True, "seq_len": SEQ_M},
    },
    "feedforward_config": {
        "name": "MLP",
        "dropout": 0,
        "activation": "relu",
        "hidden_layer_multiplier": 4,
        "dim_model": EMB,
        "number_of_experts": 4,
        "gate_config": "top_2",
    },
}
_ATT = {
    "num_heads": 4,
    "residual_dropout": 0,
    "dim_model": EMB,
    "attention": {"name": "scaled_dot_product", "dropout": 0, "causal": True, "seq_len": SEQ_M},
}
DECODER = {
    "block_type": "decoder",
    "dim_model": EMB,
    "residual_norm_style": "pre",
    "num_layers": 2,
    "position_encoding_config": {"name": "vocab", "seq_len": SEQ_M, "vocab_size": VOC, "dim_model": EMB},
    "multi_head_config_masked": _ATT,
    "multi_head_config_cross": _ATT,
    "feedforward_config": {
        "name": "MLP",
        "dropout": 0,
        "activation": "relu",
        "hidden_layer_multiplier": 4,
        "dim_model": EMB,
    },
}


@pytest.mark.parametrize("as_dict", [False, True])
@pytest.mark.parametrize("reversible", [True, False])
@pytest.mark.parametrize("tie_embedding_weights", [True, False])
@pytest.mark.parametrize("style", ["pre", "post", "deepnorm"])
def test_presets(as_dict: bool, reversible: bool, tie_embedding_weights: bool, style: str) -> None:
    torch.manual_seed(42)
    encoder, decoder = copy.deepcopy(ENCODER), copy.deepcopy(DECODER)
    encoder.update(reversible=reversible, residual_norm_style=style)
    decoder.update(residual_norm_style=style)
    config = xFormerConfig(
        {"encoder": encoder, "decoder": decoder} if as_dict else [encoder, decoder], tie_embedding_weights
    )
    stacks = config.stack_configs.values() if as_dict else config.stack_configs
    assert all(c.layer_position for c in stacks)
    refused = reversible and (tie_embedding_weights or style == "deepnorm")
    with pytest.raises(AssertionError) if refused else nullcontext():
        model = xFormer.from_config(config)
        inputs = (torch.rand((BATCH, SEQ_M)) * 10).abs().to(torch.int)
        input_mask = torch.randn(SEQ_M)
        input_mask[input_mask < 0.0] = -float("inf")
        outputs = model(inputs, encoder_input_mask=input_mask, decoder_input_mask=input_mask)
        assert outputs.shape == (BATCH, SEQ_M, EMB)
        torch.sum(torch.abs(outputs)).backward()
        if tie_embedding_weights and not reversible:
            assert model.encoders[0].pose_encoding is model.decoders[0].pose_encoding


@pytest.mark.parametrize("weight_init", [w.value for w in xFormerWeightInit])
@pytest.mark.parametrize("feedforward", ["MLP", "Conv2DFeedforward"])
@pytest.mark.parametrize("deepnorm", [False, True])
def test_weight_init(weight_init: str, feedforward: str, deepnorm: bool) -> None:
    import brickwork.xformers.factory.weight_init as weight_init_module

    encoder, decoder = copy.deepcopy(ENCODER), copy.deepcopy(DECODER)
    if deepnorm:
        encoder["residual_norm_style"] = decoder["residual_norm_style"] = "deepnorm"
        encoder["feedforward_config"]["name"] = feedforward
    weight_init_module._assert_if_not_initialized = True
    try:
        model = xFormer.from_config(
            xFormerConfig([encoder, decoder], tie_embedding_weights=False, weight_init=weight_init)
        )
    finally:
        weight_init_module._assert_if_not_initialized = False
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_hierarchical_transformer() -> None:
    image_size = 32
    stages = [
        BasicLayerConfig(
            embedding=64,
            attention_mechanism="pooling",
            patch_size=7,
            stride=4,
            padding=2,
            seq_len=image_size * image_size // 16,
            feedforward="MLP",
        ),
        BasicLayerConfig(
            embedding=128,
            attention_mechanism="pooling",
            patch_size=3,
            stride=2,
            padding=1,
            seq_len=image_size * image_size // 64,
            feedforward="MLP",
            repeat_layer=2,
        ),
        BasicLayerConfig(
            embedding=320,
            attention_mechanism="scaled_dot_product",
            patch_size=3,
            stride=2,
            padding=1,
            seq_len=image_size * image_size // 256,
            feedforward="MLP",
        ),
    ]
    config = get_hierarchical_configuration(
        stages, residual_norm_style="pre", use_rotary_embeddings=False, mlp_multiplier=4, dim_head=32
    )
    model = xFormer.from_config(xFormerConfig(config))
    assert model(torch.rand((2, 3, image_size, image_size))).shape == (2, 4, 320)


def test_pickling() -> None:
    config = [
        {
            "reversible": False,
            "block_type": "encoder",
            "num_layers": 2,
            "dim_model": 64,
            "residual_norm_style": "pre",
            "multi_head_config": {
                "num_heads": 4,
                "residual_dropout": 0.1,
                "use_rotary_embeddings": True,
                "attention": {"name": "scaled_dot_product", "dropout": 0.1, "causal": False},
            },
            "feedforward_config": {
                "name": "MLP",
                "dropout": 0.1,
                "activation": "gelu",
                "hidden_layer_multiplier": 4,
            },
        }
    ]
    model = xFormer.from_config(xFormerConfig(config))
    x = torch.rand(2, 8, 64)
    model.eval()
    torch.testing.assert_close(pickle.loads(pickle.dumps(model))(x), model(x))
    torch.testing.assert_close(copy.deepcopy(model)(x), model(x))


def _linformer_stacks(encoder_only: bool) -> list[dict]:
    encoder = copy.deepcopy(ENCODER)
    encoder.update(dim_model=48, num_layers=3)
    encoder["position_encoding_config"] = {"name": "vocab", "seq_len": 64, "vocab_size": 16, "dim_model": 48}
    encoder["multi_head_config"] = {
        "num_heads": 4,
        "residual_dropout": 0,
        "dim_model": 48,
        "attention": {"name": "linformer", "dropout": 0, "causal": True, "seq_len": 64},
    }
    encoder["feedforward_config"] = {
        "name": "MLP",
        "dropout": 0,
        "activation": "relu",
        "hidden_layer_multiplier": 4,
        "dim_model": 48,
    }
    if encoder_only:
        return [encoder]
    decoder = copy.deepcopy(DECODER)
    decoder.update(
        dim_model=48,
        position_encoding_config=encoder["position_encoding_config"],
        feedforward_config=encoder["feedforward_config"],
    )
    decoder["multi_head_config_masked"] = decoder["multi_head_config_cross"] = encoder["multi_head_config"]
    return [encoder, decoder]


def _with_reversible(stacks: list[dict], flag: bool) -> list[dict]:
    stacks = copy.deepcopy(stacks)
    for stack in stacks:
        if stack["block_type"] == "encoder":
            stack["reversible"] = flag
    return stacks


@pytest.mark.parametrize("encoder_only", [False, True])
def test_reversible_runs(encoder_only: bool) -> None:
    stacks = _linformer_stacks(encoder_only)
    inputs = (torch.rand((BATCH, 64)) * 10).abs().to(torch.int)
    for flag in (False, True):
        assert xFormer.from_config(xFormerConfig(_with_reversible(stacks, flag)))(inputs).shape == (
            BATCH,
            64,
            48,
        )


def test_reversible_no_alternate() -> None:
    rev, plain = (
        _with_reversible(_linformer_stacks(True), True)[0],
        _with_reversible(_linformer_stacks(True), False)[0],
    )
    with pytest.raises(AssertionError):
        xFormer.from_config(xFormerConfig([rev, plain]))


@pytest.mark.slow
def test_reversible_train() -> None:
    """Encoder only: both forms learn to tell an all-zero sequence from a random one."""
    torch.manual_seed(0)
    stacks = _linformer_stacks(True)

    def data() -> tuple[torch.Tensor, torch.Tensor]:
        zeros = torch.zeros((BATCH, 64), dtype=torch.int)
        rand = (torch.rand((BATCH, 64)) * 16).abs().to(torch.int)
        return torch.cat([zeros, rand]), torch.cat([torch.zeros(BATCH, 64), torch.ones(BATCH, 64)])

    def loss(model: torch.nn.Module) -> torch.Tensor:
        batch, target = data()
        return torch.norm(model(batch).mean(dim=-1) - target)

    for flag in (False, True):
        model = xFormer.from_config(xFormerConfig(_with_reversible(stacks, flag)))
        optim = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        with torch.no_grad():
            start = loss(model.eval()).item()
        model.train()
        for _ in range(40):
            optim.zero_grad()
            loss(model).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0, error_if_nonfinite=True)
            optim.step()
        with torch.no_grad():
            assert start / loss(model.eval()).item() > 1
