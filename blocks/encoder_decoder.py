"""Encoder-decoder (T5/BART-like): a token embedding (shared, or one per stack), an encoder stack and a
decoder stack."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from brickwork.blocks.block import DecoderBlock, EncoderBlock
from brickwork.blocks.inputs import check_token_ids, padding_mask
from brickwork.blocks.model_kind import ModelKind, Stack, StackSection, TokenModelSpec, later_option
from brickwork.blocks.output import IGNORE_INDEX, LossOutput, logits_loss
from brickwork.blocks.reversible import as_layers, run_layers
from brickwork.blocks.tied import tie_weights
from brickwork.components.attention import KVCache
from brickwork.layout import Stage, StageRecipe
from brickwork.layout.vocab_padding import pad_own_vocabulary


class EncoderDecoder(nn.Module):
    """``model(src_ids [B, S], tgt_ids [B, T], src_mask [B, S] | None) -> logits [B, T, vocab]``.

    Decoder blocks must have cross-attention. ``src_mask`` has 1 for real tokens, 0 for padding; it
    masks both encoder self-attention and decoder cross-attention. ``labels=`` [B, T] (the target ids
    that ``tgt_ids``, shifted right, lead to; -100 = not scored) returns a
    :class:`~brickwork.blocks.output.LossOutput` with the logits, as HF's seq2seq models do.
    ``vocab_multiple`` pads the embedding and head as DecoderLM's does: unseen outside.

    ``share_embeddings`` (T5's and xformers' tied encoder/decoder embeddings): both stacks embed their
    ids with ``token_embedding`` and ``position``. Off, the decoder has its own
    ``decoder_token_embedding`` and ``decoder_position_embedding`` (a copy of ``position``: a learned
    table of its own), and a tied LM head is tied to the decoder's embedding, the one of the vocabulary
    it predicts (as Marian ties it when its embeddings are not shared).
    """

    accepts_loss_kwargs = True  # HF's Trainer passes num_items_in_batch

    def __init__(
        self,
        vocab_size: int,
        encoder_layers: Sequence[EncoderBlock],
        decoder_layers: Sequence[DecoderBlock],
        position: nn.Module | None = None,
        encoder_final_norm: nn.Module | None = None,
        decoder_final_norm: nn.Module | None = None,
        tie_embeddings: bool = True,
        dropout: float = 0.0,
        vocab_multiple: int = 1,
        share_embeddings: bool = True,
    ) -> None:
        super().__init__()
        if not encoder_layers or not decoder_layers:
            raise ValueError("EncoderDecoder needs at least one encoder and one decoder layer")
        if any(layer.cross_attention is None for layer in decoder_layers):
            raise ValueError("every decoder layer of an EncoderDecoder needs cross_attention")
        dim = encoder_layers[0].attention.dim_model
        self.vocab_size = vocab_size
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.position_embedding = position
        self.dropout = nn.Dropout(dropout)
        self.encoder_layers = as_layers(encoder_layers)
        self.encoder_final_norm = encoder_final_norm if encoder_final_norm is not None else nn.Identity()
        self.share_embeddings = share_embeddings
        if not share_embeddings:
            self.decoder_token_embedding = nn.Embedding(vocab_size, dim)
            self.decoder_position_embedding = copy.deepcopy(position)
        self.decoder_layers = nn.ModuleList(decoder_layers)
        self.decoder_final_norm = decoder_final_norm if decoder_final_norm is not None else nn.Identity()
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            tie_weights(self, "lm_head.weight", f"{self.embedding_names('decoder_layers')[0]}.weight")
        pad_own_vocabulary(self, self.vocabulary_modules(), vocab_size, vocab_multiple)

    def embedding_names(self, stack: str) -> tuple[str, str]:
        """The (token embedding, position module) that embed the ids of ``stack``, "encoder_layers" or
        "decoder_layers"; the position module may be None."""
        if stack == "decoder_layers" and not self.share_embeddings:
            return "decoder_token_embedding", "decoder_position_embedding"
        return "token_embedding", "position_embedding"

    def vocabulary_modules(self) -> list[str]:
        """The modules whose rows are the vocabulary (padded by ``vocab_multiple``)."""
        tables = [self.embedding_names(stack)[0] for stack in ("encoder_layers", "decoder_layers")]
        return [*dict.fromkeys(tables), "lm_head"]

    def stage_recipe(self) -> EncoderDecoderStages:
        """How pipeline parallel splits this model into stages."""
        return EncoderDecoderStages(self)

    def _embed(self, stack: str, ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``stack``'s ids [B, T] -> [B, T, d]: its token embedding, position and dropout."""
        check_token_ids(
            "src_ids" if stack == "encoder_layers" else "tgt_ids", ids, vocab_size=self.vocab_size
        )
        token, position = (getattr(self, name) for name in self.embedding_names(stack))
        h = token(ids)
        if position is not None:
            h = position(h, offset=offset)
        return self.dropout(h)

    def encode(self, src_ids: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """[B, S] -> encoder output [B, S, d]."""
        mask = padding_mask("src_mask", src_mask, src_ids.shape)
        h = self._embed("encoder_layers", src_ids)
        h = run_layers(self.encoder_layers, h, attn_mask=mask)
        return self.encoder_final_norm(h)

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        caches: Sequence[KVCache] | None = None,
    ) -> torch.Tensor:
        """[B, T] target ids and encoder output [B, S, d] -> logits [B, T, vocab]. With ``caches`` (one
        per decoder layer, for its self-attention), the ids continue the cached ones (decoding)."""
        memory_mask = padding_mask("src_mask", src_mask, memory.shape[:2])
        h = self._embed("decoder_layers", tgt_ids, offset=caches[0].length if caches else 0)
        for i, layer in enumerate(self.decoder_layers):
            h = layer(h, memory=memory, memory_mask=memory_mask, cache=caches[i] if caches else None)
        return self.lm_head(self.decoder_final_norm(h))

    def forward(
        self,
        src_ids: torch.Tensor,
        tgt_ids: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        *,
        num_items_in_batch: int | torch.Tensor | None = None,
        ignore_index: int = IGNORE_INDEX,
    ) -> torch.Tensor | LossOutput:
        logits = self.decode(tgt_ids, self.encode(src_ids, src_mask), src_mask)
        if labels is None:
            return logits
        return logits_loss(logits, labels, num_items_in_batch, ignore_index)


class EncoderDecoderStages(StageRecipe):
    """brickwork's EncoderDecoder as Megatron's T5: the encoder's token embedding (and position table)
    sits on the first stage, the decoder's (the same modules when shared) on the stage where the
    decoder starts, which also takes the encoder's final norm; the LM head (tied to the decoder's
    embedding) on the last. Decoder stages pass ``(hidden, encoder output)`` on; ``attention_mask``
    masks the source in both stacks."""

    stacks = ("encoder_layers", "decoder_layers")

    def embedding(self, stack: str) -> list[str]:
        return [*self.model.embedding_names(stack), "dropout"]

    def head_modules(self) -> list[str]:
        return ["decoder_final_norm", "lm_head"]

    def outer_modules(self, units: Sequence[tuple[str, int]], first: bool, last: bool) -> list[str]:
        names = self.embedding("encoder_layers") if first else []
        if ("decoder_layers", 0) in units:
            names += [*self.embedding("decoder_layers"), "encoder_final_norm"]
        names += self.head_modules() if last else []
        return [n for n in dict.fromkeys(names) if getattr(self.model, n, None) is not None]

    def run(self, stage: Stage, carried: tuple, extras: dict[str, torch.Tensor]) -> Any:
        shell: EncoderDecoder = stage.shell
        h, memory = (carried[0], None) if len(carried) == 1 else carried
        if stage.is_first:
            h = shell._embed("encoder_layers", h)
        src_mask = extras.get("attention_mask")
        for stack, i in stage.units:
            layer = stage.get_submodule(f"{stack}.{i}")
            if stack == "encoder_layers":
                mask = padding_mask("src_mask", src_mask, h.shape[:2])
                h = layer(h, attn_mask=mask)
                continue
            if memory is None:
                memory = shell.encoder_final_norm(h)
                h = shell._embed("decoder_layers", extras["decoder_input_ids"])
            mask = padding_mask("src_mask", src_mask, memory.shape[:2])
            h = layer(h, memory=memory, memory_mask=mask)
        if stage.is_last:
            return shell.lm_head(shell.decoder_final_norm(h))
        return h if memory is None else (h, memory)


@dataclass(kw_only=True)
class EncoderDecoderSpec(TokenModelSpec):
    encoder: StackSection
    decoder: StackSection
    share_embeddings: bool = later_option(True)


def build_encoder_decoder(
    spec: EncoderDecoderSpec, position: nn.Module | None, encoder: Stack, decoder: Stack
) -> EncoderDecoder:
    return EncoderDecoder(
        vocab_size=spec.vocab_size,
        encoder_layers=encoder.layers,
        decoder_layers=decoder.layers,
        position=position,
        encoder_final_norm=encoder.final_norm(spec),
        decoder_final_norm=decoder.final_norm(spec),
        tie_embeddings=spec.tie_embeddings,
        dropout=spec.dropout,
        vocab_multiple=spec.vocab_multiple,
        share_embeddings=spec.share_embeddings,
    )


ENCODER_DECODER = ModelKind(
    EncoderDecoderSpec,
    build_encoder_decoder,
    "seq2seq",
)
