"""``BrickworkConfig``: the HF config of any brickwork model, carrying its spec."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import transformers

from brickwork.blocks.models import MODELS
from brickwork.checkpoint.hf_folder import MODEL_TYPE


class BrickworkConfig(transformers.PreTrainedConfig):
    """``spec``: the model's resolved brickwork spec, which is all the config says of the model;
    ``use_cache`` whether a generating forward returns its KV cache by default; the special ids
    HF's generation reads (``decoder_start_token_id`` also starts a seq2seq model's shifted labels).

    HF's own code reads some facts from a config under its own names; they are derived from the spec
    on every construction (the values a saved ``config.json`` holds for them are replaced):
    ``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ``max_position_embeddings`` and
    ``tie_word_embeddings`` for token models, ``num_labels`` for an image classifier (unless
    ``id2label`` names the classes), ``is_encoder_decoder`` for an encoder-decoder.
    """

    model_type = MODEL_TYPE
    # What HF's Trainer leaves out of the predictions it gathers: the KV cache a forward returns.
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["cache", "past_key_values"]

    spec: dict[str, Any] | None = None
    use_cache: bool = True  # a generating forward returns its KV cache by default, as HF's do
    # The ids generation and a seq2seq loss read (HF's generation config is made from these).
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    decoder_start_token_id: int | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        if self.spec is not None:
            kwargs = {**kwargs, **hf_facts(self.spec, has_labels=self.id2label is not None)}
            self.is_encoder_decoder = len(MODELS[self.spec["model"]].stacks) == 2
        super().__post_init__(**kwargs)


def hf_facts(spec: Mapping[str, Any], has_labels: bool) -> dict[str, Any]:
    """HF's names for the facts of ``spec`` that HF's code reads from a config; the layers are those of
    the kind's last stack (an encoder-decoder's decoder, which generates)."""
    stack = spec[MODELS[spec["model"]].stacks[-1]]
    facts = {"hidden_size": spec["dim_model"], "num_hidden_layers": stack["num_layers"]}
    if "vocab_size" in spec:
        facts |= {
            "vocab_size": spec["vocab_size"],
            "max_position_embeddings": spec.get("max_seq_len"),
            "tie_word_embeddings": bool(spec.get("tie_embeddings", True)),
        }
    if spec.get("num_classes") and not has_labels:
        facts["num_labels"] = spec["num_classes"]
    return facts
