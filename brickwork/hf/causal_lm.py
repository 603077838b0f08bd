"""``BrickworkForCausalLM``: a brickwork ``DecoderLM`` as HF's causal LM, generating through HF's own
``GenerationMixin`` on HF's KV cache."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import transformers
from transformers.modeling_outputs import CausalLMOutputWithPast

from brickwork.blocks.output import LossOutput
from brickwork.hf.arguments import cache_argument, refuse_unknown
from brickwork.hf.cache import layer_caches
from brickwork.hf.hidden_states import recording
from brickwork.hf.pretrained import BrickworkPreTrainedModel

# The output's cache field: ``cache`` in newer transformers, ``past_key_values`` before.
_CACHE_FIELD = next(
    f.name for f in dataclasses.fields(CausalLMOutputWithPast) if f.name in ("cache", "past_key_values")
)
# What the DecoderLM's loss takes besides the labels (HF's Trainer passes num_items_in_batch).
_LOSS_KWARGS = ("num_items_in_batch", "shift_labels", "ignore_index")


class BrickworkForCausalLM(BrickworkPreTrainedModel, transformers.GenerationMixin):
    """HF's causal LM around a brickwork ``DecoderLM`` (``model``): ``forward`` takes HF's inputs and
    returns ``CausalLMOutputWithPast``; ``generate`` is HF's (sampling, beams, stopping criteria,
    streamers, left-padded batches), reading and writing HF's ``DynamicCache`` through brickwork's
    attention (brickwork/hf/cache.py)."""

    _tied_weights_keys = {"model.lm_head.weight": "model.token_embedding.weight"}  # noqa: RUF012

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: transformers.Cache | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """input_ids [B, T] -> ``CausalLMOutputWithPast``: ``logits`` [B, T, vocab] (the last
        ``logits_to_keep`` positions when > 0), ``loss`` with ``labels`` (HF's: the input ids, shifted
        inside), the cache, and with ``output_hidden_states`` the embedding output and each layer's.

        ``attention_mask`` [B, cached + T]: 1 = real token, 0 = padding; ``position_ids`` [B, T] each
        token's position (HF's ``generate`` counts a left-padded row's from its first real token).
        ``cache`` (``past_key_values`` in older transformers) is an HF ``Cache`` the new keys and
        values are appended to; with ``use_cache`` (default ``config.use_cache``) and none given, a
        ``DynamicCache`` is made. While training with labels the logits are None: the head's loss is
        fused (``DecoderLM.forward``). ``num_items_in_batch``, ``shift_labels`` and ``ignore_index``
        go to the loss; any other keyword is a TypeError.
        """
        cache = cache_argument(cache, kwargs)
        loss_kwargs = {k: kwargs.pop(k) for k in _LOSS_KWARGS if k in kwargs}
        refuse_unknown(kwargs)
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if use_cache and cache is None:
            cache = transformers.DynamicCache(config=self.config)
        layers = layer_caches(cache, len(self.model.layers)) if cache is not None else None
        record = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        with recording(self.model.layers, self.model.final_norm, record) as hidden_states:
            if labels is None and "shift_labels" not in loss_kwargs:
                hidden = self.model.hidden_states(input_ids, attention_mask, layers, position_ids)
                loss, logits = None, self.model.lm_head(hidden[:, -logits_to_keep:])
            else:
                out: LossOutput = self.model(
                    input_ids, attention_mask, layers, labels, position_ids=position_ids, **loss_kwargs
                )
                loss, logits = out.loss, out.logits
        output = CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=tuple(hidden_states) if record else None,
            **{_CACHE_FIELD: cache if use_cache else None},
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return output if return_dict else output.to_tuple()
