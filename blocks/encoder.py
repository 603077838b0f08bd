"""BERT-like encoder: token, position and token-type embeddings, embedding norm, EncoderBlocks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import torch
from torch import nn

from brickwork.blocks.block import EncoderBlock
from brickwork.blocks.heads import MaskedLMHead, Pooler
from brickwork.blocks.inputs import check_token_ids, padding_mask
from brickwork.blocks.model_kind import ModelKind, Stack, StackSection, TokenModelSpec
from brickwork.blocks.output import IGNORE_INDEX, LossOutput, logits_loss
from brickwork.blocks.reversible import as_layers, run_layers
from brickwork.blocks.tied import tie_weights
from brickwork.checks import NonNegativeInt
from brickwork.components.feedforward.activations import check_activation
from brickwork.errors import ConfigError
from brickwork.layout.vocab_padding import pad_own_vocabulary


class Encoder(nn.Module):
    """``model(input_ids [B, T], attention_mask [B, T] | None, token_type_ids [B, T] | None)``.

    Returns hidden states [B, T, d], or MLM logits [B, T, vocab] when built with ``mlm_head``.
    ``attention_mask`` has 1 for real tokens and 0 for padding. With an MLM head, ``labels=`` [B, T]
    (the original ids at the positions they score, -100 elsewhere) returns a
    :class:`~brickwork.blocks.output.LossOutput` with the logits, as HF's ``BertForMaskedLM`` does.
    ``vocab_multiple`` pads the embedding and the MLM decoder as DecoderLM's does: unseen outside.
    """

    # What HF's Trainer reads: it passes num_items_in_batch and counts the labels as they are.
    accepts_loss_kwargs = True
    loss_type = "ForMaskedLM"

    def __init__(
        self,
        vocab_size: int,
        layers: Sequence[EncoderBlock],
        position: nn.Module | None = None,
        type_vocab_size: int = 0,
        embedding_norm: nn.Module | None = None,
        final_norm: nn.Module | None = None,
        mlm_head: MaskedLMHead | None = None,
        pooler: bool = False,
        dropout: float = 0.0,
        tie_embeddings: bool = True,
        vocab_multiple: int = 1,
    ) -> None:
        super().__init__()
        if not layers:
            raise ValueError("Encoder needs at least one layer")
        dim = layers[0].attention.dim_model
        self.vocab_size, self.type_vocab_size = vocab_size, type_vocab_size
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.position_embedding = position
        self.token_type_embedding = nn.Embedding(type_vocab_size, dim) if type_vocab_size > 0 else None
        self.embedding_norm = embedding_norm if embedding_norm is not None else nn.Identity()
        self.dropout = nn.Dropout(dropout)
        self.layers = as_layers(layers)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        self.mlm_head = mlm_head
        if mlm_head is not None and tie_embeddings:
            tie_weights(self, "mlm_head.decoder.weight", "token_embedding.weight")
        self.pooler = Pooler(dim) if pooler else None
        pad_own_vocabulary(self, self.vocabulary_modules(), vocab_size, vocab_multiple)

    def vocabulary_modules(self) -> list[str]:
        """The modules whose rows are the vocabulary (padded by ``vocab_multiple``)."""
        return ["token_embedding"] + (["mlm_head.decoder"] if self.mlm_head is not None else [])

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T] ids -> [B, T, d]."""
        check_token_ids("input_ids", input_ids, vocab_size=self.vocab_size)
        h = self.token_embedding(input_ids)
        if self.position_embedding is not None:
            h = self.position_embedding(h)
        if self.token_type_embedding is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            check_token_ids("token_type_ids", token_type_ids, vocab_size=self.type_vocab_size)
            h = h + self.token_type_embedding(token_type_ids)
        elif token_type_ids is not None:
            raise ValueError("token_type_ids given, but this encoder has no token-type embedding")
        return self.dropout(self.embedding_norm(h))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """[B, T, d] -> hidden states, or MLM logits when there is an MLM head."""
        h = self.final_norm(h)
        return self.mlm_head(h) if self.mlm_head is not None else h

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """The pooled first-token summary [B, d] of final hidden states [B, T, d]."""
        if self.pooler is None:
            raise ValueError("this encoder was built without a pooler (pooler=False)")
        return self.pooler(hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        num_items_in_batch: int | torch.Tensor | None = None,
        ignore_index: int = IGNORE_INDEX,
    ) -> torch.Tensor | LossOutput:
        if labels is not None and self.mlm_head is None:
            raise ValueError("labels= scores masked-LM logits, but this encoder has no mlm_head")
        mask = padding_mask("attention_mask", attention_mask, input_ids.shape)
        h = self.embed(input_ids, token_type_ids)
        h = run_layers(self.layers, h, attn_mask=mask)
        out = self.head(h)
        if labels is None:
            return out
        return logits_loss(out, labels, num_items_in_batch, ignore_index)


@dataclass(kw_only=True)
class EncoderSpec(TokenModelSpec):
    type_vocab_size: NonNegativeInt = 0
    embedding_norm: bool = False
    head: Literal["none", "mlm"] = "none"
    head_activation: Annotated[str, check_activation] = "gelu"
    pooler: bool = False
    encoder: StackSection


def build_encoder(spec: EncoderSpec, position: nn.Module | None, encoder: Stack) -> Encoder:
    mlm_head = None
    if spec.head == "mlm":
        mlm_head = MaskedLMHead(spec.dim_model, spec.vocab_size, encoder.norm(), spec.head_activation)
    return Encoder(
        vocab_size=spec.vocab_size,
        layers=encoder.layers,
        position=position,
        type_vocab_size=spec.type_vocab_size,
        embedding_norm=encoder.norm() if spec.embedding_norm else None,
        final_norm=encoder.final_norm(spec),
        mlm_head=mlm_head,
        pooler=spec.pooler,
        dropout=spec.dropout,
        tie_embeddings=spec.tie_embeddings,
        vocab_multiple=spec.vocab_multiple,
    )


def check_trainable(spec: Mapping[str, Any]) -> None:
    if spec.get("head") != "mlm":
        raise ConfigError(
            f"an encoder trains as a masked LM, which needs head: mlm, got {spec.get('head')!r}", "head"
        )


ENCODER = ModelKind(EncoderSpec, build_encoder, "masked_lm", check_trainable)
