"""Qwen3 (``Qwen3ForCausalLM``): Qwen2's layers with an RMSNorm over each query and key head.

``q_norm`` and ``k_norm`` (RMSNorm over ``head_dim`` channels with the model's ``rms_norm_eps``, before
rotary) are the attention's ``qk_norm``; ``attention_bias`` puts biases on all four projections or on
none. Under tensor parallel the norms are ``per_head``: replicated, each rank norming its own heads,
their gradients summed over the ranks. Sliding windows by layer, weight names and the pipeline recipe
are Qwen2's (Llama's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from .config import HFConfig
from .family import Variant, causal_lm
from .llama import GATED_LAYER_PLAN, Llama
from .qwen2 import Qwen2
from .spec import spec_attention, unsupported


class Qwen3(Qwen2):
    name = "qwen3"
    model_type = "qwen3"
    lm: ClassVar[Variant] = causal_lm("Qwen3ForCausalLM")
    variants: ClassVar[dict[str, Variant]] = {lm.architecture: lm}
    shape = "rotary + RMSNorm + gated MLP + q/k norms"
    layer_plan: ClassVar[Mapping[str, str]] = {
        **GATED_LAYER_PLAN,
        "self_attn.q_norm": "per_head",
        "self_attn.k_norm": "per_head",
    }
    attention_bias: ClassVar[bool | str | None] = None
    qk_norm: ClassVar[bool] = True
    # Qwen3Config's head_dim when a config.json leaves it out (not hidden_size // num_attention_heads).
    head_dim_default: ClassVar[int | None] = 128

    def attention_options(self, cfg: HFConfig, eps: float) -> dict[str, Any]:
        return {"bias": bool(cfg.get("attention_bias", False)), "qk_norm": {"name": "rmsnorm", "eps": eps}}

    def matches(self, spec: Mapping[str, Any]) -> bool:
        return Llama.matches(self, spec) and spec_attention(spec).get("qk_norm") is not None

    def hf_attention(self, attention: Mapping[str, Any], eps: float) -> dict[str, Any]:
        norm = attention["qk_norm"]
        if norm["name"] != "rmsnorm" or norm["eps"] != eps:
            raise unsupported(
                self.name,
                "decoder.block.attention.qk_norm",
                f"HF {self.name} norms q and k heads by RMSNorm with the model's eps ({eps})",
            )
        return {"attention_bias": attention["bias"]}
