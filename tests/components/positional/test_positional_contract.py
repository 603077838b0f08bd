"""Every registered position scheme, through its calling convention: shapes, gradients, options."""

from __future__ import annotations

import pytest
import torch

from brickwork.components.positional import POSITIONAL_REGISTRY, PositionalEncoding
from brickwork.errors import ConfigError

OPTIONS = {
    "sine": {"dim_model": 8},
    "learned": {"max_seq_len": 16, "dim_model": 8},
    "rotary": {"dim_head": 8},
    "alibi": {"num_heads": 4},
}
BAD = {
    "sine": [("dim_model", 0), ("base", -1.0)],
    "learned": [("max_seq_len", 0), ("dim_model", 2.5)],
    "rotary": [
        ("dim_head", 0),
        ("fraction", 1.5),
        ("fraction", 0.1),
        ("interleaved", "no"),
        ("max_seq_len", 0),
    ],
    "alibi": [("num_heads", 0), ("symmetric", 1)],
}


def test_every_registered_name_has_options_here() -> None:
    assert sorted(OPTIONS) == POSITIONAL_REGISTRY.keys()


def apply(name: str, module: PositionalEncoding, offset: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) pairs through the family's calling convention."""
    if name in ("sine", "learned"):
        x = torch.randn(2, 5, 8, requires_grad=True)
        return [(x, module(x, offset=offset))]
    if name == "rotary":
        q = torch.randn(2, 4, 5, 8, requires_grad=True)
        k = torch.randn(2, 2, 5, 8, requires_grad=True)
        q_out, k_out = module(q, k, offset=offset)
        return [(q, q_out), (k, k_out)]
    bias = module(3, 5 + offset, "cpu")
    assert bias.shape == (4, 3, 5 + offset) and bias.dtype == torch.float32
    return []


@pytest.mark.parametrize("name", POSITIONAL_REGISTRY.keys())
@pytest.mark.parametrize("offset", [0, 3])
def test_shapes_and_gradients(name: str, offset: int) -> None:
    torch.manual_seed(0)
    module = POSITIONAL_REGISTRY.get(name)(**OPTIONS[name])
    pairs = apply(name, module, offset)
    for x, y in pairs:
        assert y.shape == x.shape and y.dtype == x.dtype
    if not pairs:
        return
    sum(y.square().sum() for _, y in pairs).backward()
    for x, _ in pairs:
        assert x.grad is not None and x.grad.abs().sum() > 0
    for pname, p in module.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", POSITIONAL_REGISTRY.keys())
def test_from_config_matches_direct_build(name: str) -> None:
    cls = POSITIONAL_REGISTRY.get(name)
    torch.manual_seed(0)
    direct = cls(**OPTIONS[name])
    torch.manual_seed(0)
    built = cls.from_config(cls.Config(**OPTIONS[name]))
    assert type(built) is cls
    assert direct.state_dict().keys() == built.state_dict().keys()
    for key, value in direct.state_dict().items():
        torch.testing.assert_close(value, built.state_dict()[key])


@pytest.mark.parametrize(("name", "option", "value"), [(n, o, v) for n, bad in BAD.items() for o, v in bad])
def test_bad_option_raises_config_error_naming_it(name: str, option: str, value: object) -> None:
    with pytest.raises(ConfigError, match=option):
        POSITIONAL_REGISTRY.get(name)(**{**OPTIONS[name], option: value})


@pytest.mark.parametrize("name", ["sine", "learned", "rotary"])
def test_negative_offset_raises_value_error(name: str) -> None:
    module = POSITIONAL_REGISTRY.get(name)(**OPTIONS[name])
    with pytest.raises(ValueError, match="offset"):
        apply(name, module, -1)


def test_derived_buffers_stay_out_of_checkpoints() -> None:
    assert list(POSITIONAL_REGISTRY.get("rotary")(dim_head=8).state_dict()) == []
    assert list(POSITIONAL_REGISTRY.get("alibi")(num_heads=4).state_dict()) == []
    assert list(POSITIONAL_REGISTRY.get("learned")(max_seq_len=4, dim_model=2).state_dict()) == ["weight"]
