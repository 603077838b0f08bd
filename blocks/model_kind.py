"""What makes a model kind: its spec section, its builder and what training needs to know of it.

Each kind (``decoder_lm``, ``encoder``, ...) is declared once, beside its container class, as a
:class:`ModelKind`; ``brickwork.blocks.MODELS`` maps the names to them. The factory reads a kind's
top-level keys and stacks from it and calls its ``build``; ``brickwork train`` asks it for the
default task (which fixes the data made for it and what one sample is) and whether a spec can train
on it.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from brickwork.checks import PositiveInt, Probability
from brickwork.errors import ConfigError, join_path
from brickwork.option_types import CheckedConfig

ChoiceSpec = dict[str, Any] | str
PositionSpec = dict[str, Any] | str | list[dict[str, Any] | str] | None


# Metadata of a spec field that the resolved spec leaves out while it holds its default.
LATER_OPTION = "later_option"


def later_option(default: Any) -> Any:
    """A spec field added after specs of its kind were first resolved and saved. At ``default`` the
    resolved spec leaves it out (:func:`later_defaults`), so the specs of models without it, which
    checkpoints keep and resumes and layouts compare, stay exactly as they were."""
    return field(default=default, metadata={LATER_OPTION: True})


def later_defaults(spec: ModelSpec) -> set[str]:
    """The fields of ``spec`` made by :func:`later_option` that hold their default."""
    return {
        f.name
        for f in dataclasses.fields(spec)
        if f.metadata.get(LATER_OPTION) and getattr(spec, f.name) == f.default
    }


@dataclass
class StackSection(CheckedConfig):
    """A stack's spec, and the type of a kind's spec fields that are stacks: ``num_layers`` copies of
    ``block`` (a block's keys, :class:`~brickwork.blocks.block.BlockSpec`); ``layers`` overrides parts
    of it for single layers.

    ``reversible`` runs the stack as a RevNet coupling (blocks/reversible.py): pre-norm
    self-attention blocks only.
    """

    num_layers: PositiveInt
    block: dict[str, Any]
    layers: dict[int | str, dict[str, Any]] = field(default_factory=dict)  # keyed by int once checked
    reversible: bool = False

    def check_options(self) -> None:
        """Each ``layers`` key a layer index, given once (a JSON key, ``"1"``, is read as 1)."""
        layers: dict[int | str, dict[str, Any]] = {}
        for key, value in self.layers.items():
            index = int(key) if isinstance(key, str) and key.strip().isdigit() else key  # a JSON key
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.num_layers:
                reason = f"must be a layer index in [0, num_layers={self.num_layers}), got {key!r}"
                raise ConfigError(reason, join_path("layers", key))
            if index in layers:
                raise ConfigError(f"layer {index} is overridden twice", join_path("layers", key))
            layers[index] = value
        self.layers = layers


@dataclass(kw_only=True)
class ModelSpec(CheckedConfig):
    """Keys shared by every model kind (docs/spec.md lists them)."""

    model: str
    dim_model: PositiveInt
    position: PositionSpec = None
    dropout: Probability = 0.0
    final_norm: bool = True
    init: ChoiceSpec = field(default_factory=lambda: {"name": "normal"})


@dataclass(kw_only=True)
class TokenModelSpec(ModelSpec):
    """A model over token ids. ``vocab_multiple`` pads the embedding and vocabulary head to a multiple
    of it inside the model (1: no padding); outside, the vocabulary is ``vocab_size``."""

    vocab_size: PositiveInt
    max_seq_len: PositiveInt | None = None
    tie_embeddings: bool = True
    vocab_multiple: PositiveInt = 1


@dataclass(frozen=True)
class Stack:
    """A built stack: its layers (a list, or one reversible module) and its block norm (a partial
    taking ``dim``), of which the final and embedding norms are made."""

    layers: Sequence[nn.Module] | nn.Module
    norm: functools.partial

    def final_norm(self, spec: ModelSpec) -> nn.Module | None:
        return self.norm() if spec.final_norm else None


@dataclass(frozen=True)
class ModelKind:
    """One model kind.

    - ``spec``: the dataclass of its top-level keys; its fields of type ``StackSection`` are its
      stacks, built in their order (one named ``decoder`` is causal, and has cross-attention when
      another stack comes first).
    - ``build(spec, position, **stacks)``: the model from the checked keys, the additive position
      module (or None) and each built :class:`Stack` by its key.
    - ``task``: the loss ``brickwork train`` uses by default (a registered ``brickwork.train`` task
      name; the task says what one sample is and makes the data); ``check_trainable(spec)`` raises
      ConfigError when a spec of the kind cannot train on it.
    """

    spec: type[ModelSpec]
    build: Callable[..., nn.Module]
    task: str
    check_trainable: Callable[[Mapping[str, Any]], None] = lambda spec: None

    @property
    def stacks(self) -> tuple[str, ...]:
        hints = typing.get_type_hints(self.spec)
        return tuple(f.name for f in dataclasses.fields(self.spec) if hints[f.name] is StackSection)
