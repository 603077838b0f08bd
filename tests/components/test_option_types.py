"""A component built directly has its option types checked by the factory's own checker, and a config
section (a CheckedConfig) is checked the same way."""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Annotated, Any

import pytest
import torch

import brickwork.components  # noqa: F401  (registers every component)
from brickwork.checks import InRange, OneOf, PositiveInt
from brickwork.components.attention.base import ATTENTION_REGISTRY
from brickwork.components.attention.favor import FavorAttention
from brickwork.components.attention.multi_head import MultiHeadAttention, RotaryHook
from brickwork.components.configurable import Configurable
from brickwork.components.feedforward.base import FEEDFORWARD_REGISTRY
from brickwork.components.positional.base import POSITIONAL_REGISTRY
from brickwork.components.positional.rotary import RotaryEmbedding
from brickwork.components.residual.base import RESIDUAL_REGISTRY
from brickwork.components.residual.deepnorm import DeepNormResidual
from brickwork.components.residual.norms import NORM_REGISTRY
from brickwork.errors import ConfigError
from brickwork.option_types import CheckedConfig, to_config, type_hints

REGISTRIES = (ATTENTION_REGISTRY, FEEDFORWARD_REGISTRY, POSITIONAL_REGISTRY, RESIDUAL_REGISTRY, NORM_REGISTRY)
# The required sizes of the registered components, small and mutually consistent.
SIZES = {"dim_model": 16, "dim": 16, "num_heads": 2, "dim_head": 8, "max_seq_len": 16}
# A wrong type for each kind of option: a flag is no number, and a number is no flag.
WRONG = {int: True, int | None: True, bool: 1, bool | None: 1}


def first_int_or_bool_option(cls: type) -> str:
    """The first option annotated ``int`` or ``bool`` (optional or not, checks stripped)."""
    hints = type_hints(inspect.unwrap(cls.__init__))
    return next(name for name, annotation in hints.items() if annotation in WRONG)


CASES = [
    (f"{r.family}:{name}", cls, first_int_or_bool_option(cls))
    for r in REGISTRIES
    for name, cls in r._entries.items()
    if any(a in WRONG for a in type_hints(inspect.unwrap(cls.__init__)).values())
]
CASES.append(("multi_head", MultiHeadAttention, "dim_model"))


def test_the_registry_wide_cases_cover_every_family() -> None:
    assert {case[0].split(":")[0] for case in CASES} >= {r.family for r in REGISTRIES}
    assert len(CASES) >= 20


@pytest.mark.parametrize(("name", "cls", "option"), CASES, ids=[c[0] for c in CASES])
def test_a_wrong_type_fails_at_construction_naming_the_option(name: str, cls: type, option: str) -> None:
    params = list(inspect.signature(cls).parameters)
    required = {k: v for k, v in SIZES.items() if k in params}
    annotation = type_hints(inspect.unwrap(cls.__init__))[option]
    with pytest.raises(ConfigError, match=rf"^{option}: ") as err:
        cls(**{**required, option: WRONG[annotation]})
    assert err.value.path == option, name


def test_a_non_callable_hook_is_refused_and_any_callable_taken() -> None:
    with pytest.raises(ConfigError, match=r"^rotary: expected RotaryHook \| null, got bool True"):
        MultiHeadAttention(16, 2, rotary=True)
    with pytest.raises(ConfigError, match=r"^position_bias: expected PositionBiasHook \| null, got int 3"):
        MultiHeadAttention(16, 2, position_bias=3)
    layer = MultiHeadAttention(16, 2, rotary=lambda q, k, offset=0: (2 * q, k))
    x = torch.randn(1, 4, 16)
    assert layer(x).shape == (1, 4, 16)


def test_a_yaml_ish_int_for_a_float_passes_unconverted_and_a_bare_int_is_checked() -> None:
    rotary = RotaryEmbedding(dim_head=8, base=10000, fraction=1)
    assert rotary.config.base == 10000 and type(rotary.config.base) is int
    assert DeepNormResidual(alpha=2, beta=1).config.alpha == 2
    with pytest.raises(ConfigError, match=r"^seed: expected int \| null, got str '2'"):
        FavorAttention(seed="2")  # no check of its own: the type check is the seed's


class Toy(Configurable):
    """A component with one option of each annotation form the checker knows."""

    def __init__(
        self,
        scale: float = 1.0,
        sizes: tuple[int, ...] = (1,),
        pair: tuple[int, str] = (1, "a"),
        hook: RotaryHook | None = None,
        extra: Any = None,
        flag: bool = False,
        width: PositiveInt = 4,
        names: dict[str, int] | None = None,
    ) -> None:
        super().__init__()

    @staticmethod
    def check_options(options: Any) -> None:
        if options.width == 3:
            raise ConfigError("must not be 3", "width")


def test_a_list_for_a_tuple_passes_as_given_and_its_items_are_checked() -> None:
    toy = Toy(scale=2, sizes=[2, 3], pair=[4, "b"], names={"a": 1})
    assert toy.config.sizes == [2, 3] and toy.config.scale == 2
    with pytest.raises(ConfigError, match=r"^sizes\.1: expected int, got str 'x'"):
        Toy(sizes=[2, "x"])
    with pytest.raises(ConfigError, match=r"^pair: expected a list of 2 items, got 3"):
        Toy(pair=[1, "a", 2])
    with pytest.raises(ConfigError, match=r"^names\.a: expected int, got float 1\.5"):
        Toy(names={"a": 1.5})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scale": True}, r"^scale: expected float, got bool True"),
        ({"scale": "1.0"}, r"^scale: expected float, got str '1.0'"),
        ({"flag": 1}, r"^flag: expected bool, got int 1"),
        ({"hook": "rotary"}, r"^hook: expected RotaryHook \| null, got str 'rotary'"),
        # The option's own check and the cross-option rule speak first: their messages say more.
        ({"width": "4"}, r"^width: must be a positive integer, got '4'"),
        ({"width": 3, "flag": 1}, r"^width: must not be 3"),
    ],
)
def test_wrong_types_name_the_option_after_its_own_checks(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Toy(**options)


def test_anything_goes_where_the_annotation_is_any_and_a_hook_may_be_any_callable() -> None:
    marker = object()
    toy = Toy(extra=marker, hook=print)
    assert toy.config.extra is marker and toy.config.hook is print


@dataclasses.dataclass(frozen=True)
class Section(CheckedConfig):
    """A config section on the components' idiom: checks on the fields, one rule across them."""

    size: PositiveInt = 2
    low: Annotated[float, InRange(0, 1, open_high=True)] = 0.0
    high: Annotated[float, InRange(0, open_low=True)] | None = None
    mode: Annotated[str, OneOf(("a", "b"))] = "a"
    names: tuple[str, ...] = ()

    def check_options(self) -> None:
        if self.high is not None and self.high <= self.low:
            raise ConfigError(f"must be above low={self.low}, got {self.high}", "high")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"size": 0}, r"^size: must be a positive integer, got 0"),
        ({"low": 1}, r"^low: must be a number in \[0, 1\), got 1"),
        ({"low": -0.5}, r"^low: must be a number in \[0, 1\), got -0.5"),
        ({"high": 0}, r"^high: must be a number > 0, got 0"),
        ({"high": math.inf}, r"^high: must be a finite number, got inf"),
        ({"high": math.nan}, r"^high: must be a finite number, got nan"),
        ({"mode": "c"}, r"^mode: unknown value 'c'; allowed: a, b"),
        # The field's own check speaks before the rule across fields, and both before the type check.
        ({"low": 2, "high": 0.5}, r"^low: must be a number in \[0, 1\)"),
        ({"low": 0.5, "high": 0.25}, r"^high: must be above low=0.5, got 0.25"),
        ({"size": 3, "names": ("x", 1)}, r"^names\.1: expected str, got int 1"),
    ],
)
def test_a_checked_config_runs_field_checks_then_its_rule_then_the_types(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Section(**options)


def test_a_checked_config_keeps_what_passes_and_reads_from_a_spec_under_its_path() -> None:
    section = Section(low=0, high=None, names=["x"])  # None skips an optional field's checks
    assert (section.low, section.high, section.names) == (0, None, ["x"])  # checked, not converted
    assert to_config(Section, {"size": 3, "high": 2}, "section") == Section(size=3, high=2.0)
    with pytest.raises(ConfigError, match=r"^section\.high: must be above low=0.5, got 0.5"):
        to_config(Section, {"low": 0.5, "high": 0.5}, "section")
    with pytest.raises(ConfigError, match=r"^section\.sise: unknown key 'sise'.*did you mean 'size'"):
        to_config(Section, {"sise": 3}, "section")
