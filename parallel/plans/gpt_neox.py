"""HF GPT-NeoX (``GPTNeoXModel``, ``GPTNeoXForCausalLM``): q, k, v interleaved per head in one projection.

The LM head is ``lm_head`` in recent transformers and ``embed_out`` in older ones.
"""

from __future__ import annotations

from torch import nn

from brickwork.parallel.plans.model_plan import ModelPlan, prefix, with_head


def gpt_neox_plan(model: nn.Module) -> ModelPlan:
    p = prefix(model, "gpt_neox")
    plan = {
        f"{p}embed_in": "vocab",
        # [heads, (q, k, v), head_dim] along the output: a plain column split keeps whole heads.
        f"{p}layers.*.attention.query_key_value": "colwise",
        f"{p}layers.*.attention.dense": "rowwise",
        f"{p}layers.*.mlp.dense_h_to_4h": "colwise",
        f"{p}layers.*.mlp.dense_4h_to_h": "rowwise",
    }
    return ModelPlan(
        with_head(model, plan, "lm_head", "embed_out"),
        {},
        {"num_attention_heads": model.config.num_attention_heads},
    )
