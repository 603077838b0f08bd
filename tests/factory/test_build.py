"""build_model / build_block: inputs, .spec round trips, determinism, per-layer overrides."""

import copy
import json
from typing import Any

import pytest
import torch
import yaml
from factory_specs import run, tiny_decoder, tiny_encoder
from torch import nn

from brickwork.components.attention import LocalAttention, ScaledDotProduct
from brickwork.factory import ConfigError, build_block, build_model, dump_spec, resolve_spec


def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def test_every_kind_builds_runs_and_round_trips_through_its_spec(tiny_spec: dict[str, Any]) -> None:
    original = copy.deepcopy(tiny_spec)
    model = build_model(tiny_spec)
    assert tiny_spec == original, "build_model changed the caller's spec"
    out = run(model, tiny_spec["model"])
    out.float().square().mean().backward()
    assert torch.isfinite(out).all()
    again = build_model(model.spec)
    assert shapes(again) == shapes(model)
    assert again.spec == model.spec, "the resolved spec is a fixed point"
    assert type(again) is type(model)


def test_resolved_spec_fills_defaults_and_drops_redundant_overrides() -> None:
    spec = tiny_decoder()
    spec["decoder"]["layers"][2] = {"attention": {"num_heads": 4}}  # the same as the block: no difference
    resolved = build_model(spec).spec
    block = resolved["decoder"]["block"]
    assert block["attention"]["mechanism"] == {
        "name": "scaled_dot_product",
        "dropout": 0.0,
        "backend": "sdpa",
        "scale": None,
    }
    assert block["feedforward"]["bias"] is True and block["attention"]["dropout"] == 0.0
    assert resolved["init"] == {"name": "normal", "std": 0.02, "scaled_residual": False}
    assert resolved["decoder"]["layers"] == {
        1: {
            "attention": {"mechanism": {"name": "local", "window_size": 3, "dropout": 0.0, "backend": "auto"}}
        }
    }
    assert "causal" not in block["attention"]["mechanism"], "a decoder fixes causality; it is not an option"


def test_per_layer_overrides_make_hybrid_stacks() -> None:
    model = build_model(tiny_decoder())
    kinds = [type(layer.attention.mechanism) for layer in model.layers]
    assert kinds == [ScaledDotProduct, LocalAttention, ScaledDotProduct]
    assert all(layer.attention.causal for layer in model.layers)
    assert model.layers[1].attention.mechanism.config.window_size == 3


def test_string_keys_from_json_select_layers_too() -> None:
    spec = json.loads(json.dumps(tiny_decoder()))
    assert list(spec["decoder"]["layers"]) == ["1"]
    model = build_model(spec)
    assert isinstance(model.layers[1].attention.mechanism, LocalAttention)
    assert list(model.spec["decoder"]["layers"]) == [1]


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_build_from_a_file(tmp_path, suffix: str) -> None:
    path = tmp_path / f"model{suffix}"
    dump_spec(tiny_decoder(), path)
    torch.manual_seed(0)
    from_file = build_model(path)
    torch.manual_seed(0)
    from_dict = build_model(tiny_decoder())
    assert from_file.spec == from_dict.spec
    for (k, a), (_, b) in zip(from_file.state_dict().items(), from_dict.state_dict().items()):
        assert torch.equal(a, b), k


def test_same_seed_same_weights_and_outputs() -> None:
    torch.manual_seed(3)
    a = build_model(tiny_decoder())
    torch.manual_seed(3)
    b = build_model(tiny_decoder())
    torch.manual_seed(4)
    c = build_model(tiny_decoder())
    ids = torch.randint(0, 50, (2, 7))
    assert torch.equal(a(ids), b(ids))
    assert not torch.equal(a.layers[0].attention.qkv_proj.weight, c.layers[0].attention.qkv_proj.weight)


def test_tied_embeddings_share_one_tensor() -> None:
    model = build_model(tiny_decoder())
    assert model.lm_head.weight is model.token_embedding.weight
    untied = build_model({**tiny_decoder(), "tie_embeddings": False})
    assert untied.lm_head.weight is not untied.token_embedding.weight


def test_overrides_argument_and_path_input(tmp_path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(tiny_decoder()))
    model = build_model(path, overrides=["decoder.num_layers=2", "decoder.layers={}"])
    assert len(model.layers) == 2 and model.spec["decoder"]["num_layers"] == 2


def test_spec_must_be_a_mapping_or_a_spec_file() -> None:
    with pytest.raises(ConfigError, match=r"mapping or a \.yaml/\.json path"):
        build_model(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"suffix '\.txt'"):
        build_model("model.txt")


def test_resolve_alone_allocates_nothing_and_matches_build() -> None:
    resolved = resolve_spec(tiny_decoder())
    assert resolved == build_model(tiny_decoder()).spec
    assert list(resolved["decoder"]["layers"]) == [1]
    assert resolved["decoder"]["layers"][1]["attention"]["mechanism"]["name"] == "local"


# --- build_block against torch's own Transformer layers --------------------------------------------


def copy_into_torch_layer(block: nn.Module, layer: nn.Module, cross: bool = False) -> None:
    """Load a brickwork block's weights into nn.TransformerEncoderLayer / DecoderLayer."""
    with torch.no_grad():

        def attention(ours: nn.Module, theirs: nn.MultiheadAttention) -> None:
            theirs.in_proj_weight.copy_(
                torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight])
            )
            theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
            theirs.out_proj.weight.copy_(ours.out_proj.weight)
            theirs.out_proj.bias.copy_(ours.out_proj.bias)

        attention(block.attention, layer.self_attn)
        norms = [block.attention_norm, block.feedforward_norm]
        if cross:
            attention(block.cross_attention, layer.multihead_attn)
            norms.insert(1, block.cross_attention_norm)
        theirs_norms = [layer.norm1, layer.norm2, layer.norm3] if cross else [layer.norm1, layer.norm2]
        for ours, theirs in zip(norms, theirs_norms):
            theirs.weight.copy_(ours.weight)
            theirs.bias.copy_(ours.bias)
        layer.linear1.load_state_dict(block.feedforward.up_proj.state_dict())
        layer.linear2.load_state_dict(block.feedforward.down_proj.state_dict())


@pytest.mark.parametrize("residual", ["pre", "post"])
def test_encoder_block_matches_torch_transformer_encoder_layer(residual: str) -> None:
    block = build_block(
        {
            "type": "encoder",
            "dim_model": 16,
            "residual": residual,
            "attention": {"num_heads": 4},
            "feedforward": {"name": "mlp", "hidden_dim": 32, "activation": "relu"},
        }
    )
    torch_layer = nn.TransformerEncoderLayer(
        16, 4, 32, dropout=0.0, activation="relu", batch_first=True, norm_first=residual == "pre"
    )
    copy_into_torch_layer(block, torch_layer)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(block(x), torch_layer(x), atol=1e-5, rtol=1e-5)
    assert block.spec["type"] == "encoder" and block.spec["residual"] == {"name": residual}


def test_decoder_block_with_cross_attention_matches_torch_transformer_decoder_layer() -> None:
    block = build_block(
        {
            "type": "decoder",
            "dim_model": 16,
            "attention": {"num_heads": 2},
            "cross_attention": {"num_heads": 2},
            "feedforward": {"name": "mlp", "hidden_dim": 24, "activation": "relu"},
        }
    )
    torch_layer = nn.TransformerDecoderLayer(
        16, 2, 24, dropout=0.0, activation="relu", batch_first=True, norm_first=True
    )
    copy_into_torch_layer(block, torch_layer, cross=True)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    causal = nn.Transformer.generate_square_subsequent_mask(5)
    expected = torch_layer(x, memory, tgt_mask=causal, tgt_is_causal=True)
    torch.testing.assert_close(block(x, memory=memory), expected, atol=1e-5, rtol=1e-5)


def test_block_spec_takes_rotary_but_not_embedding_positions() -> None:
    block = build_block(
        {"type": "decoder", "dim_model": 16, "position": "rotary", "attention": {"num_heads": 2}}
    )
    assert block.attention.rotary is not None and block.spec["position"]["name"] == "rotary"
    with pytest.raises(ConfigError, match=r"^position: 'learned' is added to token embeddings"):
        build_block(
            {"type": "encoder", "dim_model": 16, "position": "learned", "attention": {"num_heads": 2}}
        )


def test_alibi_defaults_to_the_symmetric_bias_in_an_encoder_only() -> None:
    encoder = tiny_encoder()
    encoder["position"] = {"name": "alibi"}
    model = build_model(encoder)
    assert model.spec["position"] == {"name": "alibi", "symmetric": True}
    bias = model.layers[0].attention.position_bias(4, 4, "cpu")  # (H, Tq, Tk)
    # Row 0 falls off toward later keys as row 3 does toward earlier ones: -slope * |i - j|.
    torch.testing.assert_close(bias[:, 0], bias[:, 3].flip(-1))
    assert (bias[:, 0, 1:] < 0).all()
    decoder = tiny_decoder()
    decoder["position"] = {"name": "alibi"}
    assert build_model(decoder).spec["position"] == {"name": "alibi", "symmetric": False}
    encoder["position"] = {"name": "alibi", "symmetric": False}
    assert build_model(encoder).spec["position"]["symmetric"] is False
