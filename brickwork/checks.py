"""Small checks for config fields (brickwork/option_types.py), each raising ConfigError naming the option."""

from __future__ import annotations

import math
from typing import Annotated

from brickwork.errors import ConfigError


def check_positive_int(value: object, option: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"must be a positive integer, got {value!r}", option)


def check_non_empty(value: object, option: str) -> None:
    if not value:
        raise ConfigError(f"must be non-empty, got {value!r}", option)


def check_bool(value: object, option: str) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {value!r}", option)


class OneOf:
    """A check that a value is one of ``choices``: ``Annotated[str, OneOf(("sdpa", "math"))]``."""

    def __init__(self, choices: tuple[object, ...]) -> None:
        self.choices = choices

    def __call__(self, value: object, option: str) -> None:
        # true == 1 to Python, but a flag is no zero stage.
        if isinstance(value, bool) or value not in self.choices:
            raise ConfigError(f"unknown value {value!r}", option, choices=self.choices, got=value)


class InRange:
    """A finite number in [low, high], an open end left out: ``InRange(0, 1, open_high=True)`` is [0, 1)."""

    def __init__(
        self, low: float, high: float = math.inf, *, open_low: bool = False, open_high: bool = False
    ) -> None:
        self.low, self.high, self.open_low, self.open_high = low, high, open_low, open_high

    def __call__(self, value: object, option: str) -> None:
        # 1e400 reads as inf, which a comparison with the ends alone would let through.
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or (isinstance(value, float) and not math.isfinite(value)):
            raise ConfigError(f"must be a finite number, got {value!r}", option)
        above = value > self.low if self.open_low else value >= self.low
        if not (above and (value < self.high if self.open_high else value <= self.high)):
            ends = f"{'(['[not self.open_low]}{self.low}, {self.high}{')]'[not self.open_high]}"
            wanted = f"in {ends}" if self.high < math.inf else f"{'>' if self.open_low else '>='} {self.low}"
            raise ConfigError(f"must be a number {wanted}, got {value!r}", option)


PositiveInt = Annotated[int, check_positive_int]
PositiveFloat = Annotated[float, InRange(0, open_low=True)]
Probability = Annotated[float, InRange(0, 1, open_high=True)]
Flag = Annotated[bool, check_bool]
NonNegativeInt = Annotated[int, InRange(0)]
NonNegative = Annotated[float, InRange(0)]
