"""Every invalid spec raises ConfigError naming the dotted key path and what is allowed."""

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest
from factory_specs import tiny_decoder, tiny_encoder, tiny_encoder_decoder

from brickwork.factory import ConfigError, build_block, build_model


def mutated(base: Callable[[], dict[str, Any]], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    spec = base()
    edit(spec)
    return spec


def expect_error(spec: Any, path: str, *fragments: str, build: Callable[[Any], Any] = build_model) -> str:
    before = copy.deepcopy(spec)
    with pytest.raises(ConfigError) as info:
        build(spec)
    text = str(info.value)
    assert text.startswith(f"{path}: "), text
    assert info.value.path == path
    for fragment in fragments:
        assert fragment in text, text
    assert spec == before, "the spec was changed while being checked"
    return text


def block(spec: dict[str, Any]) -> dict[str, Any]:
    return spec["decoder"]["block"]


def test_unknown_nested_key_names_the_path_and_the_closest_key() -> None:
    spec = mutated(tiny_decoder, lambda s: block(s)["attention"].update(num_head=4))
    expect_error(
        spec, "decoder.block.attention.num_head", "unknown key 'num_head'", "did you mean 'num_heads'?"
    )


def test_unknown_top_level_key_lists_the_keys_of_that_model_kind() -> None:
    text = expect_error({**tiny_decoder(), "head": "mlm"}, "head", "unknown key 'head'")
    assert "vocab_size" in text and "type_vocab_size" not in text


def test_unknown_key_inside_a_component_lists_its_options() -> None:
    spec = mutated(tiny_decoder, lambda s: block(s)["feedforward"].update(hiden_dim=8))
    expect_error(
        spec,
        "decoder.block.feedforward.hiden_dim",
        "allowed: activation, bias, dropout, hidden_dim",
        "did you mean 'hidden_dim'?",
    )


def test_unknown_registry_names_list_the_choices() -> None:
    spec = mutated(
        tiny_decoder, lambda s: block(s)["attention"].update(mechanism={"name": "scaled_dot_prodct"})
    )
    text = expect_error(
        spec,
        "decoder.block.attention.mechanism.name",
        "unknown attention 'scaled_dot_prodct'",
        "did you mean 'scaled_dot_product'?",
    )
    assert re.search(r"allowed: .*local.*scaled_dot_product", text)
    expect_error(
        mutated(tiny_decoder, lambda s: block(s).update(norm="batchnorm")),
        "decoder.block.norm.name",
        "unknown norm 'batchnorm'",
        "layernorm, rmsnorm",
    )
    expect_error(
        {**tiny_decoder(), "model": "decoderlm"},
        "model",
        "unknown model kind 'decoderlm'",
        "did you mean 'decoder_lm'?",
    )
    expect_error({**tiny_decoder(), "position": {"name": "sinus"}}, "position.name", "did you mean 'sine'?")
    expect_error({**tiny_decoder(), "init": {"name": "xavir"}}, "init.name", "did you mean 'xavier'?")


def test_missing_keys() -> None:
    spec = tiny_decoder()
    del spec["vocab_size"]
    expect_error(spec, "vocab_size", "missing required key")
    expect_error(
        mutated(tiny_decoder, lambda s: block(s)["attention"].pop("num_heads")),
        "decoder.block.attention.num_heads",
        "missing required key",
    )
    no_model = tiny_decoder()
    del no_model["model"]
    expect_error(no_model, "model", "missing required key", "decoder_lm, encoder, encoder_decoder")
    expect_error(
        mutated(tiny_decoder, lambda s: block(s)["feedforward"].pop("name")),
        "decoder.block.feedforward.name",
        "missing required key",
    )


@pytest.mark.parametrize(
    ("edit", "path", "fragment"),
    [
        (lambda s: s.update(dim_model="16"), "dim_model", "expected int, got str '16'"),
        (lambda s: s.update(dim_model=16.0), "dim_model", "expected int, got float"),
        (lambda s: s.update(tie_embeddings="yes"), "tie_embeddings", "expected bool"),
        (lambda s: s["decoder"].update(num_layers=True), "decoder.num_layers", "expected int, got bool"),
        (lambda s: block(s).update(attention=[4]), "decoder.block.attention", "expected a mapping"),
        (lambda s: block(s)["norm"].update(eps="1e-5"), "decoder.block.norm.eps", "expected float, got str"),
        (
            lambda s: block(s)["attention"].update(dropout=None),
            "decoder.block.attention.dropout",
            "expected float",
        ),
        (lambda s: s.update(position=3), "position", "expected"),
    ],
)
def test_wrong_types(edit: Callable[[dict[str, Any]], None], path: str, fragment: str) -> None:
    expect_error(mutated(tiny_decoder, edit), path, fragment)


@pytest.mark.parametrize(
    ("edit", "path", "fragment"),
    [
        (
            lambda s: s["decoder"].update(num_layers=-2),
            "decoder.num_layers",
            "must be a positive integer, got -2",
        ),
        (lambda s: s["decoder"].update(num_layers=0), "decoder.num_layers", "positive"),
        (lambda s: s.update(dropout=1.0), "dropout", "must be a number in [0, 1), got 1.0"),
        (lambda s: block(s)["attention"].update(dropout=-0.1), "decoder.block.attention.dropout", "[0, 1)"),
        (
            lambda s: block(s)["feedforward"].update(dropout=1.5),
            "decoder.block.feedforward.dropout",
            "[0, 1)",
        ),
        (lambda s: s.update(vocab_size=0), "vocab_size", "positive"),
        (lambda s: block(s)["norm"].update(eps=-1.0), "decoder.block.norm.eps", "must be a number > 0"),
        (lambda s: s["decoder"]["layers"].update({5: {}}), "decoder.layers.5", "index in [0, num_layers=3)"),
        (lambda s: s["decoder"]["layers"].update({"x": {}}), "decoder.layers.x", "in [0, num_layers=3)"),
        (lambda s: s["decoder"]["layers"].update({"1": {}}), "decoder.layers.1", "overridden twice"),
        (
            lambda s: s["decoder"]["layers"][1]["attention"]["mechanism"].update(window_size=0),
            "decoder.layers.1.attention.mechanism.window_size",
            "positive",
        ),
    ],
)
def test_out_of_range_values(edit: Callable[[dict[str, Any]], None], path: str, fragment: str) -> None:
    expect_error(mutated(tiny_decoder, edit), path, fragment)


@pytest.mark.parametrize("base", [tiny_decoder, tiny_encoder, tiny_encoder_decoder])
@pytest.mark.parametrize(
    ("value", "fragment"),
    [(0, "must be a positive integer, got 0"), (-64, "positive"), (True, "expected int, got bool"),
     (64.0, "expected int, got float"), ("64", "expected int, got str")],
)  # fmt: skip
def test_vocab_multiple_is_a_positive_int(
    base: Callable[[], dict[str, Any]], value: Any, fragment: str
) -> None:
    expect_error({**base(), "vocab_multiple": value}, "vocab_multiple", fragment)


def test_dim_model_must_divide_by_num_heads() -> None:
    spec = {**tiny_decoder(), "dim_model": 18}
    expect_error(spec, "decoder.block.attention.num_heads", "dim_model=18", "not divisible by num_heads=4")
    # With an explicit head size the model width need not divide.
    spec["decoder"]["block"]["attention"]["dim_head"] = 4
    build_model(spec)


def test_num_heads_must_be_a_multiple_of_num_kv_heads() -> None:
    spec = mutated(tiny_decoder, lambda s: block(s)["attention"].update(num_kv_heads=3))
    expect_error(
        spec, "decoder.block.attention.num_kv_heads", "num_heads=4 must be a multiple of num_kv_heads=3"
    )


def test_rotary_needs_an_even_head_dim() -> None:
    # The rotary component's own rule, with the head size the attention layer gives it.
    spec = {**tiny_decoder(), "dim_model": 12, "position": {"name": "rotary"}}
    expect_error(spec, "position.fraction", "int(dim_head * fraction) = 3 rotating channels", "even")


def test_learned_positions_need_max_seq_len() -> None:
    spec = tiny_decoder()
    del spec["max_seq_len"]
    expect_error(spec, "max_seq_len", "position 'learned' (position) needs the model's max_seq_len")


def test_deepnorm_takes_the_layer_counts_from_the_stacks() -> None:
    spec = mutated(
        tiny_encoder_decoder,
        lambda s: [s[k]["block"].update(residual="deepnorm") for k in ("encoder", "decoder")],
    )
    model = build_model(spec)
    enc, dec = model.encoder_layers[0].residual, model.decoder_layers[0].residual
    assert enc.alpha == pytest.approx(0.81 * (2**4 * 2) ** (1 / 16))
    assert dec.alpha == pytest.approx((3 * 2) ** 0.25)
    assert "num_encoder_layers" not in model.spec["encoder"]["block"]["residual"]


def test_a_standalone_deepnorm_block_needs_layer_counts_or_alpha() -> None:
    spec = {"type": "encoder", "dim_model": 8, "attention": {"num_heads": 2}, "residual": "deepnorm"}
    expect_error(spec, "residual.alpha", "num_encoder_layers", build=build_block)
    assert build_block({**spec, "num_encoder_layers": 6}).residual.alpha == pytest.approx(12**0.25)
    assert build_block({**spec, "residual": {"name": "deepnorm", "alpha": 2.0}}).residual.alpha == 2.0


def test_decoder_self_attention_needs_a_causal_mechanism() -> None:
    spec = mutated(
        tiny_decoder, lambda s: block(s)["attention"].update(mechanism={"name": "linformer", "seq_len": 12})
    )
    expect_error(spec, "decoder.block.attention.mechanism.name", "has no causal form", "allowed: ")
    causal_off = {"name": "scaled_dot_product", "causal": False}
    spec = mutated(tiny_decoder, lambda s: block(s)["attention"].update(mechanism=causal_off))
    expect_error(spec, "decoder.block.attention.mechanism.causal", "is set to True")


def test_cross_attention_rules() -> None:
    spec = mutated(
        tiny_encoder_decoder,
        lambda s: s["decoder"]["block"].update(cross_attention={"num_heads": 4, "fused_qkv": True}),
    )
    expect_error(spec, "decoder.block.cross_attention.fused_qkv", "separate q/k/v projections")
    mixer = {"num_heads": 4, "mechanism": "fourier_mix"}
    spec = mutated(tiny_encoder_decoder, lambda s: s["decoder"]["block"].update(cross_attention=mixer))
    expect_error(spec, "decoder.block.cross_attention.mechanism.name", "cannot attend to memory")
    spec = mutated(tiny_decoder, lambda s: block(s).update(cross_attention={"num_heads": 4}))
    expect_error(spec, "decoder.block.cross_attention", "unknown key 'cross_attention'")


def test_token_mixers_refuse_projection_options() -> None:
    spec = mutated(
        tiny_encoder,
        lambda s: s["encoder"]["block"]["attention"].update(mechanism="fourier_mix", num_kv_heads=1),
    )
    expect_error(spec, "encoder.block.attention.num_kv_heads", "no q/k/v projections")


def test_positions_list_allows_one_of_each_kind() -> None:
    spec = {**tiny_decoder(), "position": [{"name": "learned"}, {"name": "rotary"}]}
    model = build_model(spec)
    assert model.position_embedding is not None and model.layers[0].attention.rotary is not None
    assert model.spec["position"] == [
        {"name": "learned"},
        {"name": "rotary", "base": 10000.0, "fraction": 1.0, "interleaved": False, "scaling": None},
    ]
    expect_error({**tiny_decoder(), "position": ["learned", "sine"]}, "position.1", "two additive positions")


def test_registry_options_are_checked_by_the_components_own_config() -> None:
    spec = {**tiny_decoder(), "position": {"name": "rotary", "scaling": {"type": "linear"}}}
    expect_error(spec, "position.scaling.factor", "linear scaling needs 'factor'")
    spec = mutated(
        tiny_decoder, lambda s: block(s).update(feedforward={"name": "moe", "num_experts": 2, "top_k": 3})
    )
    expect_error(spec, "decoder.block.feedforward.top_k", "at most num_experts=2")


def test_a_spec_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match=r"a spec must be a mapping or a \.yaml/\.json path, got list"):
        from brickwork.factory import resolve_spec

        resolve_spec(["model"])


def test_dataclasses_may_have_fields_named_like_the_converter_arguments() -> None:
    from dataclasses import dataclass

    from brickwork.option_types import to_config

    @dataclass
    class Section:
        path: str | None = None
        data: int = 0
        cls: str = "x"

    got = to_config(Section, {"path": "a.txt", "data": 3, "cls": "y"}, "data")
    assert (got.path, got.data, got.cls) == ("a.txt", 3, "y")
    with pytest.raises(ConfigError, match=r"^data\.pth: .*did you mean 'path'"):
        to_config(Section, {"pth": "a.txt"}, "data")
