"""One reading of xformers configs: ``from_xformers_config`` and ``brickwork.xformers``' ``xFormer`` accept
the same configs, read them with the same defaults, and refuse the same ones at the same key."""

import copy
import re
from typing import Any

import pytest
import torch

from brickwork.factory import ConfigError, build_model, from_xformers_config
from brickwork.xformers.factory import xFormer, xFormerConfig

EMB, SEQ, VOCAB, HEADS = 32, 16, 64, 2


def _head(causal: bool) -> dict[str, Any]:
    return {"num_heads": HEADS, "attention": {"name": "scaled_dot_product", "dropout": 0.0, "causal": causal}}


def stacks() -> list[dict[str, Any]]:
    """An encoder and a decoder stack, pre-norm, leaving out what xformers defaulted."""
    common = {
        "dim_model": EMB,
        "residual_norm_style": "pre",
        "position_encoding_config": {"name": "vocab", "seq_len": SEQ, "vocab_size": VOCAB},
        "feedforward_config": {
            "name": "MLP",
            "dropout": 0.0,
            "activation": "relu",
            "hidden_layer_multiplier": 2,
        },
    }
    encoder = {"block_type": "encoder", "multi_head_config": _head(False), **copy.deepcopy(common)}
    decoder = {"block_type": "decoder", "multi_head_config_masked": _head(True), **copy.deepcopy(common)}
    decoder["multi_head_config_cross"] = _head(False)
    return [encoder, decoder]


def _older_names(c: list) -> None:
    c[0]["layer_norm_style"] = c[0].pop("residual_norm_style")
    c[1]["feedforward_config"]["name"] = "FusedMLP"


def _xformers_mechanism_name(c: list) -> None:
    c[0]["multi_head_config"]["attention"] = {
        "name": "orthoformer",
        "num_landmarks": 4,
        "landmark_selection": "random",
    }


def test_both_routes_build_the_same_configs_with_xformers_defaults() -> None:
    for edit in (_older_names, _xformers_mechanism_name):
        cfg = stacks()
        edit(cfg)
        spec = from_xformers_config(copy.deepcopy(cfg))
        ids = torch.randint(0, VOCAB, (2, SEQ))
        assert build_model(spec)(ids, ids).shape == (2, SEQ, VOCAB)
        config = xFormerConfig(copy.deepcopy(cfg))
        assert xFormer.from_config(config)(ids).shape == (2, SEQ, EMB)
        # One layer, not reversible, layernorm where the config says nothing, in both.
        assert [(c.num_layers, c.reversible, c.normalization) for c in config.stack_configs] == [
            (1, False, "layernorm")
        ] * 2
        assert (spec["encoder"]["num_layers"], spec["encoder"]["block"]["norm"]) == (1, {"name": "layernorm"})
        assert "reversible" not in spec["encoder"]
        assert spec["encoder"]["block"]["residual"] == {"name": "pre"}
        assert config.stack_configs[0].residual_norm_style == "pre"


@pytest.mark.parametrize(
    ("edit", "tied", "path"),
    [
        (lambda c: c[1].update(reversible=True), False, "stack_configs.1.reversible"),
        (lambda c: c[1].update(residual_norm_style="deepnorm"), False, "stack_configs.1.residual_norm_style"),
        (lambda c: c[0].update(reversible=True), True, "stack_configs.0.reversible"),
        (lambda c: c.insert(1, {**c[0], "reversible": True}), False, "stack_configs.1.reversible"),
    ],
    ids=["reversible-decoder", "deepnorm-in-one-stack", "reversible-and-tied", "reversible-in-one-encoder"],
)
def test_both_routes_refuse_what_xformers_refused_at_the_same_key(edit, tied: bool, path: str) -> None:
    cfg = stacks()
    edit(cfg)
    with pytest.raises(ConfigError) as info:
        from_xformers_config({"stack_configs": copy.deepcopy(cfg), "tie_embedding_weights": tied})
    assert info.value.path == path
    with pytest.raises(AssertionError, match=rf"^{re.escape(path)}: "):
        xFormer.from_config(xFormerConfig(cfg, tie_embedding_weights=tied))
