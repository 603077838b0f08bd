"""``BrickworkForImageClassification``: a brickwork ``ImageEncoder`` with classes as HF's image
classifier."""

from __future__ import annotations

from typing import Any

import torch
from transformers.modeling_outputs import ImageClassifierOutput

from brickwork.blocks.output import LossOutput
from brickwork.hf.arguments import refuse_unknown
from brickwork.hf.hidden_states import recording
from brickwork.hf.pretrained import BrickworkPreTrainedModel


class BrickworkForImageClassification(BrickworkPreTrainedModel):
    """HF's image classifier around a brickwork ``ImageEncoder`` built with ``num_classes > 0``
    (``model``); ``config.num_labels`` is its class count."""

    main_input_name = "pixel_values"

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.patch_embedding

    def forward(
        self,
        pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> ImageClassifierOutput | tuple:
        """pixel_values [B, C, H, W] -> ``ImageClassifierOutput``: ``logits`` [B, classes], ``loss``
        with ``labels`` [B] (class ids), with ``output_hidden_states`` the patch embeddings and each
        layer's output. ``num_items_in_batch`` and ``ignore_index`` go to the loss; any other keyword
        is a TypeError."""
        loss_kwargs = {k: kwargs.pop(k) for k in ("num_items_in_batch", "ignore_index") if k in kwargs}
        refuse_unknown(kwargs)
        record = self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        with recording(self.model.layers, self.model.final_norm, record) as hidden_states:
            out = self.model(pixel_values, labels, **loss_kwargs)
        loss, logits = (out.loss, out.logits) if isinstance(out, LossOutput) else (None, out)
        output = ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=tuple(hidden_states) if record else None
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return output if return_dict else output.to_tuple()
