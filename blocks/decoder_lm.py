"""Decoder-only language model: token (+ position) embedding, a stack of DecoderBlocks, norm, LM head."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.blocks.block import DecoderBlock
from brickwork.blocks.inputs import check_positions, check_token_ids, padding_mask
from brickwork.blocks.model_kind import ModelKind, Stack, StackSection, TokenModelSpec
from brickwork.blocks.output import IGNORE_INDEX, LossOutput, causal_targets, mean_loss
from brickwork.blocks.reversible import as_layers, run_layers
from brickwork.blocks.tied import tie_weights
from brickwork.components.attention import DocumentMask, KVCache
from brickwork.kernels import fused_linear_cross_entropy
from brickwork.layout.vocab_padding import pad_own_vocabulary
from brickwork.sampling import generate_ids


class DecoderLM(nn.Module):
    """``model(input_ids [B, T]) -> logits [B, T, vocab]``; ``model(input_ids, labels=input_ids)`` ->
    :class:`~brickwork.blocks.output.LossOutput` (``.loss``, and ``.logits`` in eval mode: while
    training, the head loss is fused and makes none), as HF's causal LMs do.

    ``position`` is an additive positional module (sine/learned) or None when positions live inside
    attention (rotary, ALiBi). The logits are ``head(layers(embed(ids)))``, so the pipeline layer can
    split the model by those three without knowing it.

    ``vocab_multiple`` pads the embedding and head rows to a multiple of it, for aligned GEMMs; the
    padding never shows (brickwork/layout/vocab_padding.py): the logits keep ``vocab_size`` columns,
    and the loss scores those only.
    """

    def __init__(
        self,
        vocab_size: int,
        layers: Sequence[DecoderBlock],
        position: nn.Module | None = None,
        final_norm: nn.Module | None = None,
        tie_embeddings: bool = True,
        dropout: float = 0.0,
        max_seq_len: int | None = None,
        vocab_multiple: int = 1,
    ) -> None:
        super().__init__()
        if not layers:
            raise ValueError("DecoderLM needs at least one layer")
        dim = layers[0].attention.dim_model
        self.vocab_size = vocab_size
        self.max_seq_len = max_seq_len
        self.token_embedding = nn.Embedding(vocab_size, dim)
        self.position_embedding = position
        self.dropout = nn.Dropout(dropout)
        self.layers = as_layers(layers)
        self.final_norm = final_norm if final_norm is not None else nn.Identity()
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)
        if tie_embeddings:
            tie_weights(self, "lm_head.weight", "token_embedding.weight")
        pad_own_vocabulary(self, self.vocabulary_modules(), vocab_size, vocab_multiple)

    def vocabulary_modules(self) -> list[str]:
        """The modules whose rows are the vocabulary (padded by ``vocab_multiple``)."""
        return ["token_embedding", "lm_head"]

    def tp_plan(self) -> dict[str, str]:
        """Vocab-parallel embedding, and an LM head whose logits stay split on the vocabulary."""
        return {"token_embedding": "vocab", "final_norm": "sequence_parallel", "lm_head": "colwise"}

    def embed(
        self, input_ids: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """[B, T] ids -> [B, T, d]; ``offset`` is the position of the first token (KV-cache decode),
        ``positions`` [B, T] each token's own (left-padded rows), in its place."""
        check_token_ids("input_ids", input_ids, vocab_size=self.vocab_size)
        if positions is not None:
            check_positions("position_ids", positions, input_ids.shape, self.max_seq_len)
        elif self.max_seq_len is not None and offset + input_ids.shape[1] > self.max_seq_len:
            end = offset + input_ids.shape[1]
            raise ValueError(f"input_ids reach position {end}, beyond max_seq_len={self.max_seq_len}")
        h = self.token_embedding(input_ids)
        if self.position_embedding is not None:
            where = {"offset": offset} if positions is None else {"positions": positions}
            h = self.position_embedding(h, **where)
        return self.dropout(h)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """[B, T, d] -> logits [B, T, vocab]."""
        return self.lm_head(self.final_norm(h))

    def new_cache(self) -> list[KVCache]:
        """One empty KV cache per layer, for incremental decoding."""
        return [KVCache() for _ in self.layers]

    # What HF's Trainer reads: it passes num_items_in_batch, and counts the labels after the shift.
    accepts_loss_kwargs = True
    loss_type = "ForCausalLM"

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: list[KVCache] | None = None,
        labels: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | DocumentMask | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        ignore_index: int = IGNORE_INDEX,
        return_logits: bool | None = None,
        **loss_kwargs: torch.Tensor,
    ) -> torch.Tensor | LossOutput:
        """input_ids [B, T] -> logits [B, T, vocab]. With ``cache``, the ids continue the cached ones.

        ``attention_mask`` [B, offset + T] (1 = real token, 0 = padding) covers the cached positions
        too; positions are 0..T-1 (plus the offset) whatever the padding, unless ``position_ids``
        [B, T] (HF's: each token's position, e.g. ``cumsum(attention_mask) - 1`` for left-padded rows)
        give them. ``document_ids`` [B, T] make each row a pack of documents (a document is one run of
        equal ids): a token attends causally within its own document only, and positions restart at 0
        with each one (:class:`~brickwork.components.attention.DocumentMask`, built once per forward
        and shared by the layers; a ``DocumentMask`` may be given in their place: context parallel's
        hook hands each rank the one of its slice); it takes no cache, ``attention_mask`` or
        ``position_ids``.

        With ``labels`` [B, T] (HF's meaning: the input ids, with ``ignore_index`` where nothing is
        scored; the model shifts them, so position t is scored against label t + 1) it returns a
        :class:`~brickwork.blocks.output.LossOutput`: ``loss`` the mean over the scored labels (over
        ``num_items_in_batch`` when given, as HF's Trainer does for exact gradient accumulation),
        ``loss_sum`` and ``count``, and the logits in eval mode only (``return_logits`` True or False
        decides instead: a loop that reads only the loss, as training's evaluation does, spares the
        [B, T, vocab] logits with False): the loss comes from
        ``fused_linear_cross_entropy``, which reads the final hidden states and the head weight chunk
        by chunk, so while training the whole logits and their gradient exist only where they fit one
        chunk. HF's
        ``shift_labels=`` [B, T] (the only ``loss_kwargs`` key; not a named parameter, because HF's
        Trainer takes every parameter named *label* for a column each batch must have) are labels
        already shifted: what context parallel needs, which splits the sequence after the shift.

        Under autocast the head runs in the autocast dtype, as ``lm_head`` would. The loss runs inside
        the model's forward, where data parallel's hooks (DDP's reducer, FSDP2's unsharding) see it.
        The head weight must be whole on this rank: under tensor parallel it is split over the
        vocabulary (ValueError).
        """
        unknown = sorted(set(loss_kwargs) - {"shift_labels"})
        if unknown:
            raise TypeError(f"DecoderLM.forward got unexpected keyword arguments {unknown}")
        targets = causal_targets(labels, loss_kwargs.get("shift_labels"), ignore_index)
        hidden = self.hidden_states(input_ids, attention_mask, cache, position_ids, document_ids)
        if targets is None:
            return self.lm_head(hidden)
        loss_sum, count = self._head_loss(hidden, targets, ignore_index)
        # Evaluation reads predictions (HF's compute_metrics); only training is spared the logits.
        wanted = not self.training if return_logits is None else return_logits
        logits = self.lm_head(hidden) if wanted else None
        return LossOutput(mean_loss(loss_sum, count, num_items_in_batch), logits, loss_sum, count)

    def _head_loss(
        self, hidden: torch.Tensor, targets: torch.Tensor, ignore_index: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [B, T, d], aligned targets [B, T] -> the summed loss of the fused head and the count."""
        weight = self.head_weight
        if isinstance(weight, DTensor):
            raise ValueError(
                "labels= computes the loss from the whole LM head weight, but this rank holds a "
                f"{weight.placements} DTensor of it (tensor parallel splits it over the vocabulary): "
                "take the logits and brickwork.train.vocab_parallel_cross_entropy instead"
            )
        if targets.shape != hidden.shape[:-1]:
            shape, got = tuple(hidden.shape[:-1]), tuple(targets.shape)
            raise ValueError(f"labels must have the shape of input_ids {shape}, got {got}")
        device = hidden.device.type
        if torch.is_autocast_enabled(device):  # an explicit cast: autocast does not reach the kernel
            dtype = torch.get_autocast_dtype(device)
            hidden, weight = hidden.to(dtype), weight.to(dtype)
        targets = targets.to(hidden.device)
        loss = fused_linear_cross_entropy(
            hidden, weight, targets, ignore_index=ignore_index, reduction="sum", vocab_size=self.vocab_size
        )
        return loss, (targets != ignore_index).sum()

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: list[KVCache] | None = None,
        position_ids: torch.Tensor | None = None,
        document_ids: torch.Tensor | DocumentMask | None = None,
    ) -> torch.Tensor:
        """input_ids [B, T] -> the final-normed hidden states [B, T, d] that ``lm_head`` maps to logits.

        Takes ``forward``'s inputs. With :attr:`head_weight` it is what a fused linear + cross-entropy
        loss (``brickwork.kernels.fused_linear_cross_entropy``) needs instead of logits; called directly
        it bypasses hooks on the model's forward (data parallel's), which ``forward(labels=)`` runs.
        """
        if document_ids is not None:
            return self._packed_hidden_states(input_ids, document_ids, attention_mask, cache, position_ids)
        offset = cache[0].length if cache else 0
        h = self.embed(input_ids, offset=offset, positions=position_ids)
        keys = (input_ids.shape[0], offset + input_ids.shape[1])
        mask = padding_mask("attention_mask", attention_mask, keys)
        h = run_layers(self.layers, h, attn_mask=mask, caches=cache, positions=position_ids)
        return self.final_norm(h)

    def _packed_hidden_states(
        self,
        input_ids: torch.Tensor,
        document_ids: torch.Tensor | DocumentMask,
        attention_mask: torch.Tensor | None,
        cache: list[KVCache] | None,
        position_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        """:meth:`hidden_states` of packed rows: one document mask for every layer, positions from it."""
        given = [n for n, v in (("attention_mask", attention_mask), ("cache", cache),
                                ("position_ids", position_ids)) if v is not None]  # fmt: skip
        if given:
            raise ValueError(f"document_ids say the mask and the positions themselves; got {given} too")
        if isinstance(document_ids, DocumentMask):
            documents = document_ids
        else:
            documents = DocumentMask(document_ids.to(input_ids.device))
        positions = documents.positions()
        if tuple(positions.shape) != tuple(input_ids.shape):
            shape, got = tuple(input_ids.shape), tuple(positions.shape)
            raise ValueError(f"document_ids must have the shape of input_ids {shape}, got {got}")
        h = self.embed(input_ids, positions=positions)
        h = run_layers(self.layers, h, attn_mask=documents, positions=positions)
        return self.final_norm(h)

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's weight [rows, d] (the token embedding's when tied); the head has no bias. Its
        first ``vocab_size`` rows are the vocabulary's, any others padding (``vocab_multiple``)."""
        return self.lm_head.weight

    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        window: int | None = None,
        slide: int | None = None,
    ) -> torch.Tensor:
        """Extend the prompts [B, T] by up to ``max_new_tokens`` ids on the KV cache; returns
        [B, T + N]. Greedy at temperature 0, else drawn (``top_k``, ``top_p``) from ``generator``.

        brickwork's one sampler, :func:`brickwork.sampling.generate_ids`, which ``brickwork sample``
        runs too: left-padded prompts with an ``attention_mask``, end-of-sequence ids that finish a
        row, and a context that slides past ``window`` (default ``max_seq_len``) are its.
        """
        return generate_ids(
            self, input_ids, max_new_tokens, attention_mask=attention_mask, temperature=temperature,
            top_k=top_k, top_p=top_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
            generator=generator, window=window, slide=slide,
        )  # fmt: skip


@dataclass(kw_only=True)
class DecoderLMSpec(TokenModelSpec):
    decoder: StackSection


def build_decoder_lm(spec: DecoderLMSpec, position: nn.Module | None, decoder: Stack) -> DecoderLM:
    return DecoderLM(
        vocab_size=spec.vocab_size,
        layers=decoder.layers,
        position=position,
        final_norm=decoder.final_norm(spec),
        tie_embeddings=spec.tie_embeddings,
        dropout=spec.dropout,
        max_seq_len=spec.max_seq_len,
        vocab_multiple=spec.vocab_multiple,
    )


DECODER_LM = ModelKind(DecoderLMSpec, build_decoder_lm, "causal_lm")
