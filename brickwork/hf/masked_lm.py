"""``BrickworkForMaskedLM``: a brickwork ``Encoder`` with an MLM head as HF's masked LM."""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_outputs import MaskedLMOutput

from brickwork.blocks.output import LossOutput
from brickwork.hf.arguments import refuse_unknown
from brickwork.hf.hidden_states import recording
from brickwork.hf.pretrained import BrickworkPreTrainedModel


class BrickworkForMaskedLM(BrickworkPreTrainedModel):
    """HF's masked LM around a brickwork ``Encoder`` built with ``head: mlm`` (``model``); HF's
    ``fill-mask`` pipeline and Trainer run it."""

    _tied_weights_keys = {"model.mlm_head.decoder.weight": "model.token_embedding.weight"}  # noqa: RUF012

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.mlm_head.decoder

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> MaskedLMOutput | tuple:
        """input_ids [B, T] -> ``MaskedLMOutput``: ``logits`` [B, T, vocab], ``loss`` with ``labels``
        (the original ids where scored, -100 elsewhere), with ``output_hidden_states`` the embedding
        output and each layer's. ``attention_mask`` [B, T]: 1 = real token, 0 = padding.
        ``num_items_in_batch`` and ``ignore_index`` go to the loss; any other keyword is a TypeError."""
        loss_kwargs = {k: kwargs.pop(k) for k in ("num_items_in_batch", "ignore_index") if k in kwargs}
        refuse_unknown(kwargs)
        record = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        with recording(self.model.layers, self.model.final_norm, record) as hidden_states:
            out = self.model(input_ids, attention_mask, token_type_ids, labels, **loss_kwargs)
        loss, logits = (out.loss, out.logits) if isinstance(out, LossOutput) else (None, out)
        output = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=tuple(hidden_states) if record else None
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return output if return_dict else output.to_tuple()
