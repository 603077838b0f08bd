"""Tied weights in a state dict: both names, never one storage twice.

A model whose LM head shares the token embedding's weight holds one Parameter under two names. Its
``state_dict()`` keeps both names (every layout, checkpoint and HF mapping reads them), but the
second name carries a copy: ``safetensors.torch.save_file(model.state_dict(), f)`` refuses tensors
that share memory, and HF's ``Trainer.save_model`` is exactly that call for a model that is not an HF
``PreTrainedModel``. Loading accepts a state dict with both names (they must be equal: a file whose
two copies differ was not written from a tied model) or without the second one (``save_pretrained``
writes each weight once), and the weights stay tied either way.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def tie_weights(model: nn.Module, alias: str, source: str) -> None:
    """Make ``model``'s parameter ``alias`` (e.g. ``lm_head.weight``) the very Parameter ``source``
    (``token_embedding.weight``), and register the state-dict hooks described above."""
    owner, _, attribute = alias.rpartition(".")
    setattr(model.get_submodule(owner), attribute, model.get_parameter(source))
    hooks = _TiedHooks(alias, source)
    # partials, not bound methods: torch marks a state-dict hook with an attribute
    model.register_state_dict_post_hook(functools.partial(_TiedHooks.save, hooks))
    model.register_load_state_dict_pre_hook(functools.partial(_TiedHooks.check, hooks))
    model.register_load_state_dict_post_hook(functools.partial(_TiedHooks.forgive_missing, hooks))


def is_tied(model: nn.Module, alias: str, source: str) -> bool:
    """Whether ``alias`` and ``source`` are still one tensor (a layout re-ties them, possibly as plain
    DTensor attributes; a pipeline stage may hold only one of them)."""
    first = _attribute(model, alias)
    return first is not None and first is _attribute(model, source)


def _attribute(model: nn.Module, name: str) -> object | None:
    owner, _, attribute = name.rpartition(".")
    try:
        return getattr(model.get_submodule(owner), attribute, None)
    except AttributeError:
        return None


class _TiedHooks:
    def __init__(self, alias: str, source: str) -> None:
        self.alias, self.source = alias, source
        self.loading_prefix = ""  # where the model sits in the module being loaded, for the post hook

    def save(self, model: nn.Module, state: dict[str, Any], prefix: str, _metadata: Any) -> None:
        value = state.get(prefix + self.alias)
        if (
            isinstance(value, torch.Tensor)
            and not isinstance(value, nn.Parameter)  # keep_vars=True asks for the Parameters themselves
            and is_tied(model, self.alias, self.source)
        ):
            state[prefix + self.alias] = value.detach().clone()

    def check(self, model: nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
        self.loading_prefix = prefix
        first, second = state.get(prefix + self.source), state.get(prefix + self.alias)
        if first is None or second is None or not is_tied(model, self.alias, self.source):
            return
        if isinstance(first, DTensor) or isinstance(second, DTensor):
            return  # a layout's shards: checked where the full weights are written
        if first.shape != second.shape or not torch.equal(first.detach().cpu(), second.detach().cpu()):
            raise ValueError(
                f"{prefix + self.alias!r} and {prefix + self.source!r} are one tied weight in this model, "
                "but the state dict holds two different tensors for them: it was not saved from a model "
                "tied this way"
            )

    def forgive_missing(self, model: nn.Module, incompatible: Any) -> None:
        key = self.loading_prefix + self.alias
        if is_tied(model, self.alias, self.source) and key in incompatible.missing_keys:
            incompatible.missing_keys.remove(key)
