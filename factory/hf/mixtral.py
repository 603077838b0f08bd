"""Mixtral (``MixtralForCausalLM``): Mistral's attention, and a mixture of SwiGLU experts for the MLP.

The sparse MoE block is brickwork's ``moe`` feedforward: the router (``gate``) is a bias-free linear,
softmax in float32, the top ``num_experts_per_tok`` chosen and their probabilities renormalised to sum
to one (``normalize_top_k``), each expert ``down(silu(gate(x)) * up(x))``. A live HF model keeps a
layer's experts in two tensors, ``experts.gate_up_proj`` ``[E, 2I, D]`` (each expert's gate rows, then
its up rows) and ``experts.down_proj`` ``[E, D, I]``, each cut into the experts' own weights; a
checkpoint keeps them per expert (``block_sparse_moe.experts.<e>.w1`` gate, ``w3`` up, ``w2`` down),
as HF writes and reads them.

HF's load-balancing loss (``output_router_logits``) averages the routing over all layers before taking
the product, where brickwork's MoE takes it per layer, so it is refused; without it HF's loss is the
cross entropy alone, and the converted model's ``aux_loss_weight`` is 0. Under tensor parallel the
attention splits as Llama's; the router and the experts (3-D tensors, no linear layers) stay whole on
every rank. Expert parallel splits the converted model's experts.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, ClassVar

import torch

from .config import HFConfig
from .family import Packed, Rule, Variant, causal_lm
from .llama import GATED_LAYER_PLAN, Llama, gated_mlp
from .mistral import Mistral
from .spec import hf_mlp, spec_feedforward, unsupported

_LM = causal_lm("MixtralForCausalLM")
# The same class as its checkpoints hold it, one tensor per expert and projection: a variant of its
# own (told apart by identity), picked by the tensor names.
_CHECKPOINT = causal_lm("MixtralForCausalLM")
# HF name of an expert's projection in a checkpoint -> brickwork's.
_CHECKPOINT_EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


class Mixtral(Mistral):
    name = "mixtral"
    model_type = "mixtral"
    lm: ClassVar[Variant] = _LM
    variants: ClassVar[dict[str, Variant]] = {
        _LM.architecture: _LM,
        "MixtralForCausalLM (checkpoint)": _CHECKPOINT,
    }
    shape = "rotary + RMSNorm + mixture of experts"
    layer_plan: ClassVar[Mapping[str, str]] = {
        hf: style for hf, style in GATED_LAYER_PLAN.items() if hf.startswith("self_attn.")
    }

    def variant(self, architecture: str, keys: Collection[str]) -> Variant:
        if architecture == _LM.architecture and any(".block_sparse_moe." in key for key in keys):
            return _CHECKPOINT
        return super().variant(architecture, keys)

    def feedforward(self, cfg: HFConfig, activation: str) -> dict[str, Any]:
        # HF's load-balancing loss averages the routing over all layers; brickwork's MoE takes it per layer.
        cfg.expect("output_router_logits", False, False, "HF's load-balancing loss has no brickwork twin")
        cfg.expect("router_jitter_noise", 0.0, 0.0, "brickwork's router adds no noise while training")
        cfg.get("router_aux_loss_coef")  # weighs the load-balancing loss, which is off
        expert = gated_mlp(cfg, activation, bias=False)
        return {
            "name": "moe",
            "num_experts": cfg.require("num_local_experts"),
            "top_k": cfg.get("num_experts_per_tok", 2),
            "hidden_dim": expert["hidden_dim"],
            "expert": expert["name"],
            "activation": expert.get("activation"),
            "dropout": 0.0,
            "bias": False,
            "normalize_top_k": True,
            "aux_loss_weight": 0.0,
        }

    def feedforward_rules(
        self, spec: Mapping[str, Any], variant: Variant, h: str, b: str
    ) -> list[Rule | Packed]:
        experts = spec_feedforward(spec, self.name, names=("moe",))["num_experts"]
        ff = f"{b}feedforward."
        if variant is _CHECKPOINT:
            rules: list[Rule | Packed] = [Rule(f"{h}block_sparse_moe.gate.weight", f"{ff}router.weight")]
            for e in range(experts):
                for hf, bw in _CHECKPOINT_EXPERT.items():
                    rules.append(
                        Rule(f"{h}block_sparse_moe.experts.{e}.{hf}.weight", f"{ff}experts.{e}.{bw}.weight")
                    )
            return rules
        gate_up = tuple(
            f"{ff}experts.{e}.{name}.weight" for e in range(experts) for name in ("gate_proj", "up_proj")
        )
        down = tuple(f"{ff}experts.{e}.down_proj.weight" for e in range(experts))
        return [
            Rule(f"{h}mlp.gate.weight", f"{ff}router.weight"),
            Packed(f"{h}mlp.experts.gate_up_proj", gate_up, _split_gate_up, _join_gate_up),
            Packed(f"{h}mlp.experts.down_proj", down, torch.unbind, torch.stack),
        ]

    def matches(self, spec: Mapping[str, Any]) -> bool:
        return Llama.matches(self, spec) and spec["decoder"]["block"]["feedforward"]["name"] == "moe"

    def hf_feedforward(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        moe = spec_feedforward(spec, self.name, ("moe",), bias=False)
        path = "decoder.block.feedforward"
        checks = [
            (moe["expert"] in ("swiglu", "glu"), "expert", "HF Mixtral's experts are gated (swiglu or glu)"),
            (moe["normalize_top_k"], "normalize_top_k", "HF Mixtral renormalises the top-k probabilities"),
            (not moe["aux_loss_weight"], "aux_loss_weight",
             "HF Mixtral's load-balancing loss is computed otherwise (over all layers at once); set it to 0"),
        ]  # fmt: skip
        for ok, key, why in checks:
            if not ok:
                raise unsupported(self.name, f"{path}.{key}", why)
        expert = {"hidden_dim": moe["hidden_dim"], "activation": moe["activation"] or "silu"}
        return hf_mlp(expert, self.name, "silu") | {
            "num_local_experts": moe["num_experts"],
            "num_experts_per_tok": moe["top_k"],
            "output_router_logits": False,
        }


def _split_gate_up(packed: torch.Tensor) -> Sequence[torch.Tensor]:
    """[E, 2I, D] -> expert 0's gate [I, D], its up, expert 1's gate, ..."""
    return packed.reshape(2 * packed.shape[0], -1, packed.shape[-1]).unbind(0)


def _join_gate_up(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack(list(parts))  # [2E, I, D]
    return stacked.reshape(stacked.shape[0] // 2, -1, stacked.shape[-1])
