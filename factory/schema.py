"""The typed configs of a model spec: model kinds, stacks, blocks and attention layers.

Fields holding a registry choice (``mechanism``, ``feedforward``, ``norm``, ``residual``, ``position``,
``init``) are kept as plain data here and checked against the chosen class in ``resolve``.
docs/spec.md documents every key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from brickwork.checks import check_positive_int, check_probability
from brickwork.components.feedforward.activations import check_activation
from brickwork.errors import ConfigError

ChoiceSpec = dict[str, Any] | str
PositionSpec = dict[str, Any] | str | list[dict[str, Any] | str] | None


@dataclass
class AttentionSpec:
    """One multi-head attention layer (``MultiHeadAttention``) and its mechanism."""

    num_heads: int
    num_kv_heads: int | None = None
    dim_head: int | None = None
    bias: bool = True
    fused_qkv: bool = False
    dropout: float = 0.0
    mechanism: ChoiceSpec = field(default_factory=lambda: {"name": "scaled_dot_product"})

    def __post_init__(self) -> None:
        check_positive_int(self.num_heads, "num_heads")
        if self.num_kv_heads is not None:
            check_positive_int(self.num_kv_heads, "num_kv_heads")
        if self.dim_head is not None:
            check_positive_int(self.dim_head, "dim_head")
        check_probability(self.dropout, "dropout")


@dataclass
class BlockSpec:
    """An encoder block, or a decoder block without cross-attention."""

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


@dataclass(kw_only=True)
class ModelSpec:
    """Keys shared by every model kind."""

    model: str
    dim_model: int
    position: PositionSpec = None
    dropout: float = 0.0
    final_norm: bool = True
    init: ChoiceSpec = field(default_factory=lambda: {"name": "normal"})

    def __post_init__(self) -> None:
        check_positive_int(self.dim_model, "dim_model")
        check_probability(self.dropout, "dropout")


@dataclass(kw_only=True)
class TokenModelSpec(ModelSpec):
    """A model over token ids."""

    vocab_size: int
    max_seq_len: int | None = None
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self.vocab_size, "vocab_size")
        if self.max_seq_len is not None:
            check_positive_int(self.max_seq_len, "max_seq_len")


@dataclass(kw_only=True)
class DecoderLMSpec(TokenModelSpec):
    decoder: dict[str, Any]


@dataclass(kw_only=True)
class EncoderSpec(TokenModelSpec):
    type_vocab_size: int = 0
    embedding_norm: bool = False
    head: Literal["none", "mlm"] = "none"
    head_activation: str = "gelu"
    pooler: bool = False
    encoder: dict[str, Any]

    def __post_init__(self) -> None:
        super().__post_init__()
        check_activation(self.head_activation, "head_activation")
        if self.type_vocab_size < 0:
            raise ConfigError(f"must be >= 0, got {self.type_vocab_size}", "type_vocab_size")


@dataclass(kw_only=True)
class EncoderDecoderSpec(TokenModelSpec):
    encoder: dict[str, Any]
    decoder: dict[str, Any]


@dataclass(kw_only=True)
class ImageEncoderSpec(ModelSpec):
    """A ViT: image patches instead of token ids; ``num_classes > 0`` adds a classifier."""

    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    num_classes: int = 0
    class_token: bool = True
    pool: Literal["cls", "mean"] = "cls"
    encoder: dict[str, Any]

    def __post_init__(self) -> None:
        super().__post_init__()
        for option in ("image_size", "patch_size", "channels"):
            check_positive_int(getattr(self, option), option)
        if self.num_classes < 0:
            raise ConfigError(f"must be >= 0 (0: no classifier), got {self.num_classes}", "num_classes")
        if self.image_size % self.patch_size:
            raise ConfigError(
                f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}",
                "patch_size",
            )
        if self.pool == "cls" and not self.class_token:
            raise ConfigError("pool 'cls' needs class_token: true", "pool")


MODEL_KINDS: dict[str, type[ModelSpec]] = {
    "decoder_lm": DecoderLMSpec,
    "encoder": EncoderSpec,
    "encoder_decoder": EncoderDecoderSpec,
    "image_encoder": ImageEncoderSpec,
}
# The stacks each kind has, in build order.
STACKS: dict[str, tuple[str, ...]] = {
    "decoder_lm": ("decoder",),
    "encoder": ("encoder",),
    "encoder_decoder": ("encoder", "decoder"),
    "image_encoder": ("encoder",),
}
