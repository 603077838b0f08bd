"""The spec sections the factory itself reads: stacks and blocks (a model kind's top-level keys live
with the kind, blocks/model_kind.py; each component's options are its own ``Config``).

docs/spec.md documents every key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from brickwork.blocks.model_kind import ChoiceSpec, PositionSpec
from brickwork.checks import check_positive_int
from brickwork.errors import ConfigError


@dataclass
class BlockSpec:
    """An encoder block, or a decoder block without cross-attention (``attention`` holds the
    ``MultiHeadAttention`` options and its ``mechanism``)."""

    attention: dict[str, Any]
    feedforward: ChoiceSpec = field(default_factory=lambda: {"name": "mlp"})
    norm: ChoiceSpec = field(default_factory=lambda: {"name": "layernorm"})
    residual: ChoiceSpec = field(default_factory=lambda: {"name": "pre"})


@dataclass
class CrossBlockSpec(BlockSpec):
    """A decoder block of an encoder-decoder: ``cross_attention`` defaults to the self-attention's keys."""

    cross_attention: dict[str, Any] | None = None


@dataclass(kw_only=True)
class StandaloneBlockSpec(CrossBlockSpec):
    """The spec ``build_block`` takes: a block plus what a model would otherwise supply."""

    type: Literal["encoder", "decoder"] = "encoder"
    dim_model: int
    position: PositionSpec = None
    num_encoder_layers: int = 0
    num_decoder_layers: int = 0

    def __post_init__(self) -> None:
        check_positive_int(self.dim_model, "dim_model")
        for option in ("num_encoder_layers", "num_decoder_layers"):
            if getattr(self, option) < 0:
                raise ConfigError(f"must be >= 0, got {getattr(self, option)}", option)


@dataclass
class StackSpec:
    """``num_layers`` copies of ``block``; ``layers`` overrides parts of it for single layers.

    ``reversible`` runs the stack as a RevNet coupling (blocks/reversible.py): pre-norm
    self-attention blocks only.
    """

    num_layers: int
    block: dict[str, Any]
    layers: dict[int | str, dict[str, Any]] = field(default_factory=dict)
    reversible: bool = False

    def __post_init__(self) -> None:
        check_positive_int(self.num_layers, "num_layers")
