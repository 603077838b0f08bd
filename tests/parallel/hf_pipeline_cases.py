"""HF GPT-NeoX, Qwen2, Mixtral and BERT (masked LM) split into pipeline stages by their layer lists:
what the spawned ranks run, against the one-process runs of hf_plan_cases."""

from __future__ import annotations

from typing import Any

import torch
from hf_plan_cases import STEPS, build, data, mlm_batch, mlm_rank

from brickwork.parallel import full_state_dict, parallelize
from brickwork.train import TrainStep

PP2 = {"pipeline_parallel_size": 2, "pipeline_schedule": "1f1b", "num_microbatches": 2}


def _run(family: str, task: str, batch: dict[str, torch.Tensor], layout: dict) -> dict[str, Any]:
    model = parallelize(build(family), layout)
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), task)
    losses = [step(batch) for _ in range(STEPS)]
    stages = [[name for name, _ in stage.named_parameters()] for stage in model.stages]
    return {"losses": losses, "state": full_state_dict(model), "stage_parameters": stages}


# Causal LMs split at pp=2: Qwen2's stages hold a full-attention layer and a sliding-window one, each
# given the mask of its type; Mixtral's hold a mixture of experts each.
PIPELINED = ("gpt_neox", "qwen2", "mixtral")


def pp2_rank() -> dict[str, dict[str, Any]]:
    """The PIPELINED causal LMs (next tokens) and BertForMaskedLM (masked tokens, padding, two
    segments) at pp=2."""
    ids, labels = data()
    out = {
        family: _run(family, "causal_lm", {"input_ids": ids, "labels": labels}, PP2) for family in PIPELINED
    }
    return out | {"bert": _run("bert", "masked_lm", mlm_batch(), PP2)}


def four_rank() -> dict[str, Any]:
    """On four ranks (one spawn: process start-up dominates): both models at pp2 × tp2, and
    BertForMaskedLM at dp2 × tp2 without a pipeline, with DDP and with ZeRO-3."""
    ids, labels = data()
    pp2_tp2 = {**PP2, "tensor_parallel_size": 2}
    dp2_tp2 = {"data_parallel_size": 2, "tensor_parallel_size": 2}
    return {
        "gpt_neox": _run("gpt_neox", "causal_lm", {"input_ids": ids, "labels": labels}, pp2_tp2),
        "bert": _run("bert", "masked_lm", mlm_batch(), pp2_tp2),
        "bert-dp2-tp2": mlm_rank(dp2_tp2),
        "bert-dp2-tp2-zero3": mlm_rank({**dp2_tp2, "zero_stage": 3}),
    }


def causal_reference(family: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    """A causal LM of ``family`` in one process: STEPS SGD steps of mean next-token cross entropy."""
    model = build(family)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    ids, labels = data()
    losses = []
    for _ in range(STEPS):
        logits = model(ids).logits[:, :-1]  # HF's causal-LM labels: position t scores label t + 1
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, full_state_dict(model)
