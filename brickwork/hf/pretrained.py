"""``BrickworkPreTrainedModel``: what every brickwork HF class shares, around the plain model it holds.

The HF class holds the brickwork model as its submodule ``model`` (the very object: wrapping a built
model copies nothing, and the plain model keeps working on its own), so every brickwork feature is
there unchanged, and HF's machinery (``save_pretrained``/``from_pretrained``, ``generate``, pipelines,
PEFT, the Trainer) finds what it looks for on the wrapper.

Two things HF's loader does differently from ``load_state_dict``, handled here:

- It sets each saved tensor in place of the parameter of that name, of the saved shape. Saved weights
  hold the real vocabulary rows (the wrapper's ``state_dict`` shows those only, as brickwork's
  ``save_pretrained`` writes them), so a model built from a config starts unpadded, and its
  ``vocab_multiple`` padding is laid out by :meth:`tie_weights`, which HF calls once the weights are
  in (and at construction).
- It builds the model on the meta device and makes real only what the checkpoint holds; buffers
  derived from a module's options (rotary tables, ALiBi slopes, sparsity layouts) come back empty, and
  :meth:`_init_weights` rebuilds them. Weights are never initialised there: brickwork's init schemes
  ran when the model was built, or the checkpoint gave them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import transformers
from torch import nn

from brickwork.checkpoint.hf_folder import WEIGHT_PREFIX
from brickwork.components.configurable import Configurable
from brickwork.factory import build_model
from brickwork.factory.hf.brickwork_folder import head_class_name
from brickwork.hf.config import BrickworkConfig
from brickwork.layout.vocab_padding import module_padding, pad_own_vocabulary, padded_names


class BrickworkPreTrainedModel(transformers.PreTrainedModel):
    """The HF class of one head (subclasses): ``cls(config)`` builds ``config.spec``'s model;
    :meth:`from_model` wraps a built one. ``model`` is the brickwork model."""

    config_class = BrickworkConfig
    base_model_prefix = WEIGHT_PREFIX.removesuffix(".")
    _no_split_modules: ClassVar[list[str]] = ["Block"]  # device_map="auto" keeps a block on one device
    accepts_loss_kwargs = True  # HF's Trainer passes num_items_in_batch; the model divides by it

    def __init__(self, config: BrickworkConfig, model: nn.Module | None = None) -> None:
        super().__init__(config)
        if config.spec is None:
            raise ValueError(f"{type(self).__name__} needs a BrickworkConfig with the model's spec")
        head = head_class_name(config.spec)
        if head != type(self).__name__:
            raise ValueError(
                f"this spec's model ({config.spec.get('model')}) has HF's class {head}, not "
                f"{type(self).__name__}: load it with the Auto class of that head"
            )
        if model is None:
            # Unpadded until the weights are in (see the module docstring); it carries the real spec.
            padded = config.spec.get("vocab_multiple", 1) > 1
            model = build_model({**config.spec, "vocab_multiple": 1} if padded else config.spec)
            model.spec = config.spec
        self.model = model
        if not next(model.parameters()).is_meta:  # built whole here: nothing for HF to initialise
            for module in model.modules():
                module._is_hf_initialized = True
        self.register_state_dict_post_hook(_real_vocabulary_rows)
        self.post_init()

    @classmethod
    def from_model(cls, model: nn.Module) -> BrickworkPreTrainedModel:
        """This HF class around ``model`` (built by brickwork: it carries ``.spec``), sharing its
        parameters; in ``model``'s train/eval mode."""
        spec = getattr(model, "spec", None)
        if spec is None:
            raise TypeError("from_model needs a model built by brickwork.factory (its .spec is missing)")
        return cls(BrickworkConfig(spec=dict(spec)), model=model).train(model.training)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.token_embedding

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.token_embedding = value

    def tie_weights(self, *args: Any, **kwargs: Any) -> None:
        """HF's tying, then the ``vocab_multiple`` padding of a model whose weights are in."""
        super().tie_weights(*args, **kwargs)
        multiple = self.config.spec.get("vocab_multiple", 1)
        if multiple == 1 or not hasattr(self.model, "vocabulary_modules"):
            return
        embedding = self.model.token_embedding
        if embedding.weight.is_meta or module_padding(embedding) is not None:
            return  # HF's loader has yet to set the weights, or they are laid out already
        pad_own_vocabulary(self.model, self.model.vocabulary_modules(), self.model.vocab_size, multiple)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Rebuild ``module``'s buffers derived from its options (left empty by HF's meta-device load)
        from a fresh module of the same options."""
        buffers = module._buffers
        derived = [name for name in module._non_persistent_buffers_set if buffers.get(name) is not None]
        if not derived or not isinstance(module, Configurable):
            return
        fresh = type(module).from_config(module.config)
        for name in derived:
            buffers[name] = getattr(fresh, name).to(buffers[name].device)


def _real_vocabulary_rows(
    wrapper: BrickworkPreTrainedModel, state: dict[str, Any], prefix: str, _metadata: Any
) -> None:
    """The wrapper's state dict holds the real vocabulary rows of a padded model (what is saved);
    ``keep_vars=True`` asks for the Parameters themselves, which stay whole."""
    for name, padding in padded_names([wrapper.model]).items():
        key = f"{prefix}{WEIGHT_PREFIX}{name}"
        value = state.get(key)
        if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
            state[key] = padding.unpad(value)
