"""The shape of one HF model family's adapter, and the state-dict conversion all families share.

A family module holds every fact about its HF models: the config -> spec map, the weight map, the
tensor-parallel plan and the pipeline recipe; ``FAMILIES`` (convert.py) finds it by ``model_type``.

Every family maps each HF tensor to brickwork tensors (and back) through a table of rows built from
the spec: a :class:`Rule` for one tensor on each side, a :class:`Packed` for an HF tensor that holds
several brickwork ones (Mixtral's experts of a layer in one tensor). Converting checks both sides:
an HF tensor no rule names, a rule whose tensor is absent, or a shape that does not fit raises an
error naming the key, so the loaded model can never hold a tensor left over from initialisation.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from brickwork.errors import ConfigError
from brickwork.layout import ModelPlan, StageRecipe

from .config import HFConfig

Transform = Callable[[torch.Tensor], torch.Tensor]


def same(t: torch.Tensor) -> torch.Tensor:
    return t


def transposed(t: torch.Tensor) -> torch.Tensor:
    """HF's Conv1D stores a linear weight as [in, out]; brickwork's nn.Linear as [out, in]."""
    return t.t().contiguous()


@dataclass(frozen=True)
class Rule:
    """HF tensor ``hf`` is brickwork tensor ``bw`` after ``to_bw``; ``to_hf`` is the inverse."""

    hf: str
    bw: str
    to_bw: Transform = same
    to_hf: Transform = same

    @property
    def bw_keys(self) -> tuple[str, ...]:
        return (self.bw,)

    def brickwork_tensors(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        return {self.bw: self.to_bw(tensor)}

    def hf_tensor(self, bw_state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.to_hf(bw_state[self.bw])


def module_rules(hf: str, bw: str, bias: bool = True) -> list[Rule]:
    """HF module ``hf`` (a linear layer or a norm) copied as it is to brickwork module ``bw``: its
    weight, then its bias when it has one."""
    return [Rule(f"{hf}.{t}", f"{bw}.{t}") for t in (("weight", "bias") if bias else ("weight",))]


@dataclass(frozen=True)
class Packed:
    """HF tensor ``hf`` holds the brickwork tensors ``bw``: ``split`` cuts it into them, in that order,
    and ``join`` puts them back together."""

    hf: str
    bw: tuple[str, ...]
    split: Callable[[torch.Tensor], Sequence[torch.Tensor]]
    join: Callable[[Sequence[torch.Tensor]], torch.Tensor]

    @property
    def bw_keys(self) -> tuple[str, ...]:
        return self.bw

    def brickwork_tensors(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = self.split(tensor)
        if len(parts) != len(self.bw):
            raise KeyError(f"{self.hf} of shape {tuple(tensor.shape)} does not hold {len(self.bw)} tensors")
        return {key: part.contiguous() for key, part in zip(self.bw, parts, strict=True)}

    def hf_tensor(self, bw_state: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.join([bw_state[key] for key in self.bw])


@dataclass(frozen=True)
class Variant:
    """One HF model class of a family: its head and where its tensors live."""

    architecture: str
    head: str  # "lm", "mlm" or "none"
    prefix: str  # of the base model's tensors, e.g. "transformer." in GPT2LMHeadModel
    pooler: bool = False
    # HF key -> the key whose tensor it shares when the embeddings are tied (checkpoints drop it).
    tied: Mapping[str, str] = field(default_factory=dict)
    # HF key -> a key that always holds the same tensor (BERT's two names for the MLM bias).
    aliases: Mapping[str, str] = field(default_factory=dict)
    # Old checkpoint names -> the names HF's classes use now.
    renamed: Mapping[str, str] = field(default_factory=dict)
    # HF tensors of heads this class does not have, which HF skips when loading it.
    skipped_prefixes: tuple[str, ...] = ()
    # Prefixes of head tensors, which sit outside ``prefix``.
    head_prefixes: tuple[str, ...] = ()
    # Keyword arguments of the HF class besides its config (BertModel's add_pooling_layer).
    init: Mapping[str, Any] = field(default_factory=dict)


def causal_lm(architecture: str, base: str = "model", embedding: str = "embed_tokens") -> Variant:
    """The LM class of a decoder family: its base model under ``base``, its head ``lm_head``, tied to
    the token embedding ``embedding`` of the base model."""
    return Variant(
        architecture,
        head="lm",
        prefix=f"{base}.",
        tied={"lm_head.weight": f"{base}.{embedding}.weight"},
        head_prefixes=("lm_head.",),
    )


class Family(abc.ABC):
    """What one HF family needs to convert; each family module defines one subclass."""

    name: str
    model_type: str
    variants: dict[str, Variant]
    # The brickwork architecture ``matches`` recognises, for the error when no family does.
    shape: str
    # HF tensors that HF itself skips when loading (old attention-mask buffers, cached frequencies).
    ignored_suffixes: tuple[str, ...] = ()
    # HF's default for tie_word_embeddings in this family's config class.
    tie_default: bool = True

    def variant(self, architecture: str, keys: Collection[str]) -> Variant:
        """The variant of HF class ``architecture``, whose state dict has ``keys``."""
        if architecture not in self.variants:
            raise ConfigError(
                f"HF class {architecture!r} of family {self.name!r} is not supported",
                "hf_config.architectures",
                choices=self.variants,
                got=architecture,
            )
        return self.variants[architecture]

    @abc.abstractmethod
    def spec(self, cfg: HFConfig, variant: Variant) -> dict[str, Any]:
        """The brickwork spec for an HF config; reads every key it translates from ``cfg``."""

    @abc.abstractmethod
    def rules(self, spec: Mapping[str, Any], variant: Variant) -> list[Rule | Packed]:
        """The tensor table of a model built from ``spec``."""

    @abc.abstractmethod
    def matches(self, spec: Mapping[str, Any]) -> bool:
        """Whether a brickwork spec has this family's architecture (used by ``to_hf``)."""

    @abc.abstractmethod
    def hf_config(self, spec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """(key of the variant, HF config kwargs) for a spec; refuses what HF cannot express."""

    @abc.abstractmethod
    def tp_plan(self, model: nn.Module) -> ModelPlan:
        """The tensor-parallel plan of a live HF model of this family, a base model or a task head."""

    @abc.abstractmethod
    def stage_recipe(self, model: nn.Module) -> StageRecipe:
        """How a live HF model of this family splits into pipeline stages; ConfigError for a class
        that cannot."""


def prefix(model: nn.Module, variant: Variant) -> str:
    """``variant.prefix`` when ``model`` (a task-head class) holds its base model there, else ``""``
    (``model`` is the base model itself)."""
    base = variant.prefix.removesuffix(".")
    return variant.prefix if base and isinstance(getattr(model, base, None), nn.Module) else ""


def head_of(model: nn.Module, variant: Variant) -> str | None:
    """The name of ``model``'s LM head, a linear layer under one of ``variant.head_prefixes``, or None."""
    names = (p.removesuffix(".") for p in variant.head_prefixes)
    return next((name for name in names if isinstance(getattr(model, name, None), nn.Linear)), None)


def with_head(model: nn.Module, variant: Variant, plan: dict[str, str]) -> dict[str, str]:
    """``plan`` plus a colwise (vocabulary-split) LM head, when ``model`` has one."""
    head = head_of(model, variant)
    return {**plan, head: "colwise"} if head else plan


def to_brickwork_state(
    family: Family, variant: Variant, spec: Mapping[str, Any], hf_state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """HF state dict -> brickwork state dict, strictly: every HF tensor is used exactly once."""
    state = dict(hf_state)
    for key in variant.aliases:
        if key not in state:
            raise KeyError(f"{family.name}: the HF state dict has no {key!r}")
        del state[key]
    out: dict[str, torch.Tensor] = {}
    for rule in family.rules(spec, variant):
        if rule.hf not in state:
            raise KeyError(f"{family.name}: the HF state dict has no {rule.hf!r}")
        out.update(rule.brickwork_tensors(state.pop(rule.hf)))
    if state:
        raise KeyError(f"{family.name}: HF tensors with no brickwork counterpart: {', '.join(sorted(state))}")
    return out


def to_hf_state(
    family: Family, variant: Variant, spec: Mapping[str, Any], bw_state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """brickwork state dict -> HF state dict; every brickwork tensor must be used."""
    left = set(bw_state)
    out: dict[str, torch.Tensor] = {}
    for rule in family.rules(spec, variant):
        missing = [key for key in rule.bw_keys if key not in bw_state]
        if missing:
            raise KeyError(f"{family.name}: the brickwork state dict has no {missing[0]!r}")
        out[rule.hf] = rule.hf_tensor(bw_state)
        left.difference_update(rule.bw_keys)
    for key, source in variant.aliases.items():
        out[key] = out[source]
    if left:
        raise KeyError(f"{family.name}: brickwork tensors with no HF counterpart: {', '.join(sorted(left))}")
    return out


def complete_state(
    family: Family, variant: Variant, state: Mapping[str, torch.Tensor], tied: bool
) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors in the form a live HF model's ``state_dict()`` has.

    Renames old tensor names, adds the base-model prefix that old checkpoints lack, restores the
    tensors ``save_pretrained`` drops because they are tied, and leaves out what HF itself skips when
    loading this class.
    """
    state = {variant.renamed.get(k, k): v for k, v in state.items()}
    p = variant.prefix
    if p and not any(k.startswith(p) for k in state):
        state = {k if k.startswith(variant.head_prefixes) else p + k: v for k, v in state.items()}
    state = {
        k: v
        for k, v in state.items()
        if not k.endswith(family.ignored_suffixes) and not k.startswith(variant.skipped_prefixes)
    }
    links = {**variant.aliases, **(variant.tied if tied else {})}
    for key, source in links.items():
        if key not in state and source in state:
            state[key] = state[source]
    if tied:
        _check_tied(family, variant, state)
    return state


def _check_tied(family: Family, variant: Variant, state: Mapping[str, torch.Tensor]) -> None:
    """With ``tie_word_embeddings`` on, a head weight that differs from the embedding it is tied to is
    a contradiction: HF's forward would use one, its ``tie_weights`` the other. Refused by name."""
    for key, source in variant.tied.items():
        head, embedding = state.get(key), state.get(source)
        if head is None or embedding is None or head is embedding:
            continue
        if head.shape != embedding.shape:
            how = f"in shape ({tuple(head.shape)} vs {tuple(embedding.shape)})"
        elif not torch.equal(head, embedding):
            how = f"by up to {(head.float() - embedding.float()).abs().max().item():.3g}"
        else:
            continue
        raise ConfigError(
            f"the config ties the word embeddings (tie_word_embeddings=True), but {key} differs from "
            f"{source} {how}; set tie_word_embeddings=False to keep both, or make them one tensor",
            f"hf_config.tie_word_embeddings ({family.name})",
        )
