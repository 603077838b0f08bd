"""The HF class of a brickwork model's head, and the ``config.json`` that names it.

``save_pretrained`` writes this config beside the spec and weights of a model with a head HF has, so
that ``AutoModelFor*.from_pretrained`` loads the folder through ``brickwork.hf``'s classes; the folder
form itself is ``brickwork.checkpoint``'s (hf_folder.py). Needs no ``transformers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brickwork.blocks.models import MODELS
from brickwork.checkpoint.hf_folder import MODEL_TYPE
from brickwork.errors import ConfigError

# The HF class of each training task (a model kind's task, blocks/model_kind.py): the heads HF has.
HEAD_CLASSES = {
    "causal_lm": "BrickworkForCausalLM",
    "masked_lm": "BrickworkForMaskedLM",
    "seq2seq": "BrickworkForSeq2SeqLM",
    "image_classification": "BrickworkForImageClassification",
}


def head_class_name(spec: Mapping[str, Any]) -> str:
    """The name of the HF class for ``spec``'s model; ConfigError when it has no head HF has (an
    encoder without an MLM head, an image encoder without classes), saying why."""
    kind = MODELS.get(spec.get("model"))
    if kind is None:
        raise ConfigError(f"unknown model kind {spec.get('model')!r}", "model", MODELS, spec.get("model"))
    kind.check_trainable(spec)  # a kind trains as its head, which is what HF's class needs
    return HEAD_CLASSES[kind.task]


def hf_config_dict(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ``config.json`` holds for a model of ``spec``: its HF model type, class and spec; None for
    a model without a head HF has."""
    try:
        head = head_class_name(spec)
    except ConfigError:
        return None
    return {"model_type": MODEL_TYPE, "architectures": [head], "spec": dict(spec)}
