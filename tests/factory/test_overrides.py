"""Dotted overrides (``decoder.num_layers=4``): YAML-typed values, no mutation, the same validation."""

import copy

import pytest
from factory_specs import tiny_decoder

from brickwork.factory import ConfigError, apply_overrides, build_model
from brickwork.factory.overrides import parse_override


def test_values_are_read_as_yaml() -> None:
    assert parse_override("a.b=4") == (["a", "b"], 4)
    assert parse_override("a=1.0e-5") == (["a"], 1e-5)
    assert parse_override("a=1e-5") == (["a"], 1e-5)  # text to YAML 1.1
    assert parse_override("a='1e-5'") == (["a"], "1e-5")
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=null") == (["a"], None)
    assert parse_override("a={name: local, window_size: 2}") == (["a"], {"name": "local", "window_size": 2})
    assert parse_override("a=x=y") == (["a"], "x=y")


def test_overrides_apply_to_a_copy() -> None:
    spec = tiny_decoder()
    before = copy.deepcopy(spec)
    out = apply_overrides(
        spec,
        [
            "decoder.num_layers=4",
            "decoder.block.attention.num_heads=8",
            "decoder.layers.1.attention.mechanism.window_size=5",
            "dropout=0.1",
        ],
    )
    assert spec == before
    assert out["decoder"]["num_layers"] == 4 and out["dropout"] == 0.1
    assert out["decoder"]["block"]["attention"]["num_heads"] == 8
    assert out["decoder"]["layers"][1]["attention"]["mechanism"] == {"name": "local", "window_size": 5}
    model = build_model(out)
    assert len(model.layers) == 4 and model.layers[1].attention.mechanism.config.window_size == 5


def test_new_keys_and_mapping_values() -> None:
    out = apply_overrides(
        tiny_decoder(), {"decoder.layers.2.norm": {"name": "rmsnorm"}, "position": "rotary"}
    )
    assert out["decoder"]["layers"][2] == {"norm": {"name": "rmsnorm"}} and out["position"] == "rotary"
    assert type(build_model(out).layers[2].attention_norm).__name__ == "RMSNorm"


@pytest.mark.parametrize(
    ("override", "path", "fragment"),
    [
        ("decoder.num_layers=-1", "decoder.num_layers", "positive"),
        (
            "decoder.block.attention.num_head=2",
            "decoder.block.attention.num_head",
            "did you mean 'num_heads'",
        ),
        ("decoder.block.feedforward.name=mpl", "decoder.block.feedforward.name", "did you mean 'mlp'"),
        ("vocab_size.x=1", "vocab_size.x", "not a mapping"),
        ("dim_model", None, "dotted.key=value"),
        ("a..b=1", "a..b", "empty key segment"),
        ("dropout=[1", "dropout", "not valid YAML"),
    ],
)
def test_bad_overrides_raise_config_error(override: str, path: str | None, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        apply_overrides(tiny_decoder(), [override])
    if path is not None:
        assert str(info.value).startswith(f"{path}: ")


def test_a_single_string_is_not_a_list_of_overrides() -> None:
    with pytest.raises(ConfigError, match=r"list of 'dotted\.key=value' strings"):
        apply_overrides(tiny_decoder(), "decoder.num_layers=2")


def test_block_specs_are_validated_as_blocks() -> None:
    spec = {"type": "encoder", "dim_model": 8, "attention": {"num_heads": 2}}
    assert apply_overrides(spec, ["attention.num_heads=4"])["attention"]["num_heads"] == 4
    with pytest.raises(ConfigError, match=r"^attention\.num_heads: dim_model=8"):
        apply_overrides(spec, ["attention.num_heads=3"])
