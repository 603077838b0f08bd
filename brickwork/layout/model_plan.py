"""The tensor-parallel plan of a model brickwork did not build: glob patterns over its module names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from brickwork.errors import ConfigError

# A style name (``"colwise"``, ``"colwise:3"``, ``"rowwise"``, ...), or child module -> style for the
# modules that own those children, as a component's ``tp_plan()`` declares them.
PlanValue = str | Mapping[str, str]


@dataclass(frozen=True)
class ModelPlan:
    """``plan``: module-name glob -> style, or -> {child: style} for the modules owning those children
    (see :func:`~brickwork.parallel.tensor.plan.name_plan`); ``divide``: module glob -> integer
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
