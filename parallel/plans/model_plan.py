"""A foreign model's tensor-parallel plan: styles by module pattern, attributes to divide, head counts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from brickwork.errors import ConfigError
from brickwork.parallel.tensor_parallel import PlanValue


@dataclass(frozen=True)
class ModelPlan:
    """``plan``: module-name glob -> style, or -> {child: style} for the modules owning those children
    (see :func:`~brickwork.parallel.tensor_parallel.name_plan`); ``divide``: module glob -> integer
    attributes divided by tp.

    ``heads``: head counts that must divide by the TP size ({"num_key_value_heads": 4}) when no
    module attribute carries them, so a split that would cut a head in two is refused by name.
    """

    plan: Mapping[str, PlanValue]
    divide: Mapping[str, list[str]] = field(default_factory=dict)
    heads: Mapping[str, int] = field(default_factory=dict)

    def check(self, tp: int) -> None:
        """ConfigError naming the head count that ``tp`` does not divide."""
        for name, count in self.heads.items():
            if count % tp:
                raise ConfigError(
                    f"{name}={count} is not divisible by tensor_parallel_size={tp}: a head would be split",
                    "tensor_parallel_size",
                )
