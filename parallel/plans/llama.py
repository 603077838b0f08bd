"""HF Llama (``LlamaModel``, ``LlamaForCausalLM``): separate q/k/v with grouped kv heads, SwiGLU."""

from __future__ import annotations

from torch import nn

from brickwork.parallel.plans.model_plan import ModelPlan, prefix, with_head


def llama_plan(model: nn.Module) -> ModelPlan:
    p = prefix(model, "model")
    plan = {
        f"{p}embed_tokens": "vocab",
        f"{p}layers.*.self_attn.q_proj": "colwise",
        f"{p}layers.*.self_attn.k_proj": "colwise",
        f"{p}layers.*.self_attn.v_proj": "colwise",
        f"{p}layers.*.self_attn.o_proj": "rowwise",
        f"{p}layers.*.mlp.gate_proj": "colwise",
        f"{p}layers.*.mlp.up_proj": "colwise",
        f"{p}layers.*.mlp.down_proj": "rowwise",
    }
    # The attention reshapes with -1 heads and keeps the q-per-kv ratio, so nothing needs dividing;
    # both head counts must still split whole.
    config = model.config
    heads = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
    }
    return ModelPlan(with_head(model, plan, "lm_head"), {}, heads)
