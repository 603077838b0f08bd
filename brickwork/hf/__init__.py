"""brickwork models as transformers' own classes, registered with its Auto classes on import.

``import brickwork.hf`` (which imports ``transformers``) makes ``AutoConfig`` know the model type
``"brickwork"`` and ``AutoModelForCausalLM`` / ``AutoModelForMaskedLM`` / ``AutoModelForSeq2SeqLM`` /
``AutoModelForImageClassification`` its classes, so a folder that ``save_pretrained`` wrote (brickwork's
or the HF class's) loads with ``from_pretrained``, without remote code. Plain brickwork
(``import brickwork``, ``build_model``) never imports this module, nor ``transformers``.

:func:`to_hf_class` wraps a built model in the HF class of its head, sharing its parameters.
"""

from __future__ import annotations

from torch import nn

from brickwork.extras import missing_package

try:
    import transformers
except ModuleNotFoundError as err:
    if err.name != "transformers":
        raise
    raise ModuleNotFoundError(missing_package("transformers", "brickwork.hf"), name="transformers") from None

from brickwork.checkpoint.hf_folder import MODEL_TYPE
from brickwork.factory.hf.brickwork_folder import head_class_name
from brickwork.hf.causal_lm import BrickworkForCausalLM
from brickwork.hf.config import BrickworkConfig
from brickwork.hf.image_classification import BrickworkForImageClassification
from brickwork.hf.masked_lm import BrickworkForMaskedLM
from brickwork.hf.pretrained import BrickworkPreTrainedModel
from brickwork.hf.seq2seq import BrickworkForSeq2SeqLM

HF_CLASSES: dict[str, type[BrickworkPreTrainedModel]] = {
    cls.__name__: cls
    for cls in (
        BrickworkForCausalLM,
        BrickworkForMaskedLM,
        BrickworkForSeq2SeqLM,
        BrickworkForImageClassification,
    )
}

transformers.AutoConfig.register(MODEL_TYPE, BrickworkConfig)
transformers.AutoModelForCausalLM.register(BrickworkConfig, BrickworkForCausalLM)
transformers.AutoModelForMaskedLM.register(BrickworkConfig, BrickworkForMaskedLM)
transformers.AutoModelForSeq2SeqLM.register(BrickworkConfig, BrickworkForSeq2SeqLM)
transformers.AutoModelForImageClassification.register(BrickworkConfig, BrickworkForImageClassification)


def to_hf_class(model: nn.Module) -> BrickworkPreTrainedModel:
    """``model`` (built by brickwork: it carries ``.spec``) inside the HF class of its head, sharing its
    parameters: ``BrickworkForCausalLM`` for a decoder LM, ``BrickworkForMaskedLM`` for an encoder with
    an MLM head, ``BrickworkForSeq2SeqLM`` for an encoder-decoder, ``BrickworkForImageClassification``
    for an image encoder with classes.
    ConfigError for a model without a head HF has."""
    spec = getattr(model, "spec", None)
    if spec is None:
        raise TypeError("to_hf_class needs a model built by brickwork.factory (its .spec is missing)")
    return HF_CLASSES[head_class_name(spec)].from_model(model)


__all__ = [
    "HF_CLASSES",
    "BrickworkConfig",
    "BrickworkForCausalLM",
    "BrickworkForImageClassification",
    "BrickworkForMaskedLM",
    "BrickworkForSeq2SeqLM",
    "BrickworkPreTrainedModel",
    "to_hf_class",
]
