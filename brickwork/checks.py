"""Small option checks shared by every component ``Config``; each raises ConfigError naming the option."""

from __future__ import annotations

from typing import Annotated

from brickwork.errors import ConfigError


def check_positive_int(value: object, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"must be a positive integer, got {value!r}", option)


def check_positive_float(value: object, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"must be a positive number, got {value!r}", option)


def check_probability(value: object, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise ConfigError(f"must be a number in [0, 1), got {value!r}", option)


def check_bool(value: object, option: str) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {value!r}", option)


def check_choice(value: object, option: str, choices: tuple[object, ...]) -> None:
    # true == 1 to Python, but a flag is no zero stage.
    if isinstance(value, bool) or value not in choices:
        raise ConfigError(f"unknown value {value!r}", option, choices=choices, got=value)


class OneOf:
    """A check that a value is one of ``choices``: ``Annotated[str, OneOf(("sdpa", "math"))]``."""

    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = choices

    def __call__(self, value: object, option: str) -> None:
        check_choice(value, option, self.choices)


# Annotations that carry their check, for component signatures (components/configurable.py).
PositiveInt = Annotated[int, check_positive_int]
PositiveFloat = Annotated[float, check_positive_float]
Probability = Annotated[float, check_probability]
Flag = Annotated[bool, check_bool]
