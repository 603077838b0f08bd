"""``BrickworkForSeq2SeqLM``: a brickwork ``EncoderDecoder`` as HF's seq2seq LM, generating through
HF's own ``GenerationMixin``: the encoder runs once, the decoder on HF's KV cache."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import transformers
from torch import nn
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from brickwork.blocks.output import IGNORE_INDEX, logits_loss
from brickwork.hf.arguments import cache_argument, refuse_unknown
from brickwork.hf.cache import layer_caches
from brickwork.hf.hidden_states import recording
from brickwork.hf.pretrained import BrickworkPreTrainedModel

_CACHE_FIELD = next(
    f.name for f in dataclasses.fields(Seq2SeqLMOutput) if f.name in ("cache", "past_key_values")
)


class BrickworkForSeq2SeqLM(BrickworkPreTrainedModel, transformers.GenerationMixin):
    """HF's seq2seq LM around a brickwork ``EncoderDecoder`` (``model``). ``generate`` is HF's: it
    runs :meth:`get_encoder` once, then the decoder from ``config.decoder_start_token_id`` (set it, or
    give ``generate`` one) on HF's ``EncoderDecoderCache``, whose self-attention part brickwork's
    decoder layers write (cross-attention recomputes its keys from the encoder output each step)."""

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """HF's tie map: the LM head is the decoder's token embedding (shared with the encoder, or the
        decoder's own under ``share_embeddings: false``)."""
        return {"model.lm_head.weight": f"model.{self.model.embedding_names('decoder_layers')[0]}.weight"}

    def get_output_embeddings(self) -> nn.Module:
        return self.model.lm_head

    def get_encoder(self, modality: str | None = None) -> nn.Module:
        """The encoder as HF's ``generate`` calls it: ``(input_ids, attention_mask) -> BaseModelOutput``."""
        return _Encoder(self.model)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        labels: torch.Tensor | None = None,
        cache: transformers.Cache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> Seq2SeqLMOutput | tuple:
        """Source ``input_ids`` [B, S] (``attention_mask``: 1 = real token) and ``decoder_input_ids``
        [B, T] -> ``Seq2SeqLMOutput``: ``logits`` [B, T, vocab], ``loss`` with ``labels`` [B, T] (the
        target ids; without ``decoder_input_ids`` they are shifted right after
        ``config.decoder_start_token_id`` to make them, as HF's seq2seq models do), the cache, the
        encoder output, and with ``output_hidden_states`` the decoder's hidden states.

        ``encoder_outputs`` (what :meth:`get_encoder` returned) spare the encoder pass. ``cache`` is an
        HF ``EncoderDecoderCache`` (or a ``Cache`` for the decoder's self-attention); with ``use_cache``
        (default ``config.use_cache``) and none given, one is made. ``num_items_in_batch`` and
        ``ignore_index`` go to the loss; any other keyword is a TypeError.
        """
        cache = cache_argument(cache, kwargs)
        loss_kwargs = {k: kwargs.pop(k) for k in ("num_items_in_batch", "ignore_index") if k in kwargs}
        decoder_mask = kwargs.pop("decoder_attention_mask", None)
        if decoder_mask is not None and not bool(decoder_mask.all()):
            raise ValueError("decoder_attention_mask: brickwork's decoder takes unpadded decoder_input_ids")
        refuse_unknown(kwargs)
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("give decoder_input_ids, or labels to shift right into them")
            decoder_input_ids = self._shift_right(labels, loss_kwargs.get("ignore_index", IGNORE_INDEX))
        if encoder_outputs is None:
            encoder_outputs = self.get_encoder()(input_ids, attention_mask)
        memory = encoder_outputs[0]
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
        own = cache.self_attention_cache if isinstance(cache, transformers.EncoderDecoderCache) else cache
        layers = layer_caches(own, len(self.model.decoder_layers)) if own is not None else None
        record = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        stack, norm = self.model.decoder_layers, self.model.decoder_final_norm
        with recording(stack, norm, record) as hidden_states:
            logits = self.model.decode(decoder_input_ids, memory, attention_mask, layers)
        loss = None if labels is None else logits_loss(logits, labels, **loss_kwargs).loss
        output = Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            decoder_hidden_states=tuple(hidden_states) if record else None,
            encoder_last_hidden_state=memory,
            **{_CACHE_FIELD: cache if use_cache else None},
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return output if return_dict else output.to_tuple()

    def _shift_right(self, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
        """The decoder inputs of target ids [B, T]: ``decoder_start_token_id`` then the ids but the last,
        an ignored label read as ``pad_token_id``."""
        start, pad = self.config.decoder_start_token_id, self.config.pad_token_id
        shifted = torch.cat([torch.full_like(labels[:, :1], start or 0), labels[:, :-1]], dim=1)
        ignored = shifted == ignore_index
        if start is None or (pad is None and bool(ignored.any())):
            raise ValueError(
                "shifting labels into decoder_input_ids needs config.decoder_start_token_id (and "
                "config.pad_token_id where labels are ignored)"
            )
        return shifted.masked_fill(ignored, pad) if pad is not None else shifted


class _Encoder(nn.Module):
    """An ``EncoderDecoder``'s encoder, called as HF's encoders are."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,
    ) -> BaseModelOutput:
        """[B, S] source ids -> ``BaseModelOutput`` with the encoder output [B, S, d], which is what HF's
        ``generate`` asks for (``return_dict=True``)."""
        if output_attentions or output_hidden_states:
            raise ValueError("the encoder returns its output alone (no attention maps, no hidden states)")
        return BaseModelOutput(last_hidden_state=self.model.encode(input_ids, attention_mask))
