"""Pipeline stages of an HF causal LM, cut by its layer list (GPT-2, GPT-NeoX and the Llama-shaped
families share this)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from brickwork.errors import ConfigError
from brickwork.layout import Stage, StageRecipe

from .family import Variant, head_of, prefix


def _cache_argument() -> str:
    import inspect

    from transformers.masking_utils import create_causal_mask

    return "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


class HFCausalLMStages(StageRecipe):
    """An HF causal LM split by its layer list (``layers``, in the base model under ``variant.prefix``):
    the token embedding (and a learned position table, GPT-2's, and the embedding dropout) on the first
    stage, the final norm and LM head (one of ``variant.head_prefixes``) on the last. Every stage builds
    the causal masks (one per layer type where the config has ``layer_types``, sliding-window ones where
    it has a ``sliding_window``) and, with ``rotary``, the rotary tables from a module without
    parameters that every stage holds, as the HF model's own forward does. Another class of the family
    (the bare base model, a classifier) is refused by name."""

    def __init__(
        self,
        model: nn.Module,
        variant: Variant,
        layers: str,
        embed: str,
        norm: str,
        *,
        position: str | None = None,
        dropout: str | None = None,
        rotary: str | None = None,
    ) -> None:
        super().__init__(model)
        p, head = prefix(model, variant), head_of(model, variant)
        if not p or head is None:
            raise ConfigError(
                f"pipeline parallel splits {variant.architecture} (embedding, layers, final norm, LM "
                f"head); {type(model).__name__} is not one",
                "pipeline_parallel_size",
            )
        self.stacks = (p + layers,)
        self.embed, self.norm, self.head = p + embed, p + norm, head
        self.position, self.dropout, self.rotary = (p + n if n else None for n in (position, dropout, rotary))

    def head_modules(self) -> list[str]:
        return [self.norm, self.head]

    def outer_modules(self, units: Sequence[tuple[str, int]], first: bool, last: bool) -> list[str]:
        names = [n for n in (self.embed, self.position, self.dropout) if n] if first else []
        names += [self.rotary] if self.rotary else []
        return names + (self.head_modules() if last else [])

    def run(self, stage: Stage, carried: tuple, extras: dict[str, torch.Tensor]) -> Any:
        # Imported here: transformers is needed only when an HF model is pipelined.
        from transformers.masking_utils import create_masks_for_generate

        h = carried[0]
        positions = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
        if stage.is_first:
            h = stage.get_submodule(self.embed)(h)
            if self.position is not None:
                h = h + stage.get_submodule(self.position)(positions)
            if self.dropout is not None:
                h = stage.get_submodule(self.dropout)(h)
        # No cache here; transformers 5.24 renamed the argument that takes one (past_key_values ->
        # cache), so it is passed under whichever name this version declares.
        no_cache = {_cache_argument(): None}
        masks = create_masks_for_generate(
            config=self.model.config,
            inputs_embeds=h,
            attention_mask=extras.get("attention_mask"),
            position_ids=positions,
            **no_cache,
        )
        by_type = masks if isinstance(masks, Mapping) else None
        kwargs: dict[str, Any] = {} if by_type else {"attention_mask": masks}
        if self.rotary is not None:
            rotary = stage.get_submodule(self.rotary)(h, position_ids=positions)
            kwargs.update(position_embeddings=rotary, position_ids=positions)
        layer_types = getattr(self.model.config, "layer_types", ())
        h = run_layers(stage, self.stacks[0], h, kwargs, by_type, layer_types)
        if not stage.is_last:
            return h
        return stage.get_submodule(self.head)(stage.get_submodule(self.norm)(h))


def run_layers(
    stage: Stage,
    stack: str,
    h: torch.Tensor,
    kwargs: dict[str, Any],
    masks: Mapping[str, Any] | None = None,
    layer_types: Sequence[str] = (),
) -> torch.Tensor:
    """Run the stage's layers of ``stack`` in turn; HF layers may return a tuple led by the hidden states.
    With ``masks`` by layer type, layer i gets the attention mask of ``layer_types[i]``."""
    for name, layer in stage.get_submodule(stack).named_children():
        if masks is not None:
            kwargs = {**kwargs, "attention_mask": masks[layer_types[int(name)]]}
        out = layer(h, **kwargs)
        h = out[0] if isinstance(out, tuple) else out
    return h
