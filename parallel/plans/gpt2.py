"""HF GPT-2 (``GPT2Model``, ``GPT2LMHeadModel``): fused q|k|v in a transposed ``Conv1D``, tied head."""

from __future__ import annotations

from torch import nn

from brickwork.parallel.plans.model_plan import ModelPlan, prefix, with_head


def gpt2_plan(model: nn.Module) -> ModelPlan:
    p = prefix(model, "transformer")
    plan = {
        f"{p}wte": "vocab",
        f"{p}h.*.attn.c_attn": "colwise:3",  # q | k | v along the output: each rank takes its heads of each
        f"{p}h.*.attn.c_proj": "rowwise",
        f"{p}h.*.mlp.c_fc": "colwise",
        f"{p}h.*.mlp.c_proj": "rowwise",
    }
    # The attention splits its fused output by split_size and reshapes by the head count.
    divide = {f"{p}h.*.attn": ["split_size", "num_heads", "embed_dim"]}
    return ModelPlan(with_head(model, plan, "lm_head"), divide, {"n_head": model.config.n_head})
