"""Tiny models of every family, their fixed batches, a plain torch training loop written here as the
reference, and the functions spawned ranks run (they must live in an importable module)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from brickwork.blocks import decoder_lm
from brickwork.factory import build_model, get_preset
from brickwork.parallel import full_state_dict, parallel_state, parallelize, split_rows
from brickwork.train import TASKS, TrainStep, evaluate

VOCAB, DIM, SEQ, ROWS, STEPS = 48, 32, 8, 4, 3
IMAGE, PATCH, CLASSES = 8, 4, 5
FAMILIES = ("decoder", "mlm", "seq2seq", "vit", "gpt2-hf")
CAUSAL = ("decoder", "gpt2-hf", "llama-hf")
TASK = {
    "decoder": "causal_lm",
    "mlm": "masked_lm",
    "seq2seq": "seq2seq",
    "vit": "image_classification",
    "gpt2-hf": "causal_lm",
    "llama-hf": "causal_lm",
}


def _shrink(block: dict[str, Any]) -> None:
    block["attention"]["num_heads"] = 4
    block["feedforward"]["hidden_dim"] = 64
    # Dropout would draw different random numbers in every layout: off, as in the references.
    block["attention"]["dropout"] = 0.0
    block["attention"].get("mechanism", {})["dropout"] = 0.0
    block["feedforward"]["dropout"] = 0.0


def spec(family: str, moe: bool = False) -> dict[str, Any]:
    """A 2-layer spec of ``family`` (decoder, mlm, seq2seq, vit); ``moe``: a decoder with 4 top-1 experts."""
    preset = {"decoder": "gpt-tiny", "mlm": "bert-base", "seq2seq": "t5-small", "vit": "vit"}[family]
    out = copy.deepcopy(get_preset(preset))
    out["dim_model"] = DIM
    out["dropout"] = 0.0
    stacks = (
        ["decoder"] if family == "decoder" else ["encoder", "decoder"] if family == "seq2seq" else ["encoder"]
    )
    for stack in stacks:
        out[stack]["num_layers"] = 2
        _shrink(out[stack]["block"])
    if family == "vit":
        out.update(image_size=IMAGE, patch_size=PATCH, channels=3, num_classes=CLASSES)
    else:
        out.update(vocab_size=VOCAB, max_seq_len=2 * SEQ)
    if moe:
        out["decoder"]["block"]["feedforward"] = {
            "name": "moe",
            "num_experts": 4,
            "top_k": 1,
            "hidden_dim": 32,
            "aux_loss_weight": 0.1,
        }
    return out


def build(family: str, seed: int = 0, moe: bool = False) -> nn.Module:
    torch.manual_seed(seed)
    if family == "gpt2-hf":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=VOCAB, n_positions=2 * SEQ, n_embd=DIM, n_layer=2, n_head=4, bos_token_id=0,
            eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        return GPT2LMHeadModel(config)
    if family == "llama-hf":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=VOCAB, hidden_size=DIM, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2 * SEQ,
            bos_token_id=0, eos_token_id=0, pad_token_id=0,
        )  # fmt: skip
        return LlamaForCausalLM(config)
    model = build_model(spec(family, moe))
    if moe:
        starve_last_expert(model)
    return model


@torch.no_grad()
def starve_last_expert(model: nn.Module) -> None:
    """Router row of the last expert := the mean of the first two: its logit is never the largest
    (it lies between theirs), so at top-1 it gets no token on any rank before training moves it."""
    for module in model.modules():
        router = getattr(module, "router", None)
        if router is not None:
            router.weight[-1] = (router.weight[0] + router.weight[1]) / 2


def global_batches(family: str) -> list[dict[str, torch.Tensor]]:
    """STEPS global batches of ROWS rows for ``family``, the same in every process."""
    g = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(STEPS):
        if family == "vit":
            out.append(
                {
                    "pixel_values": torch.randn(ROWS, 3, IMAGE, IMAGE, generator=g),
                    "labels": torch.randint(0, CLASSES, (ROWS,), generator=g),
                }
            )
            continue
        ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
        # Rows 1 and 3 end in padding: the masks must reach every layer (and pipeline stage).
        mask = torch.ones(ROWS, SEQ, dtype=torch.long)
        mask[1, -2:] = 0
        mask[3, -3:] = 0
        if family in CAUSAL:
            out.append({"input_ids": ids, "labels": ids.clone()})  # HF's meaning: the model shifts them
        elif family == "mlm":
            scored = torch.rand(ROWS, SEQ, generator=g) < 0.3
            scored[:, 0] = True
            out.append(
                {
                    "input_ids": torch.where(scored, 1, ids),
                    "attention_mask": mask,
                    "token_type_ids": (torch.arange(SEQ) >= SEQ // 2).long().expand(ROWS, SEQ).clone(),
                    "labels": torch.where(scored & mask.bool(), ids, -100),
                }
            )
        else:
            target = torch.randint(0, VOCAB, (ROWS, SEQ // 2), generator=g)
            start = torch.zeros(ROWS, 1, dtype=torch.long)
            out.append(
                {
                    "input_ids": ids,
                    "attention_mask": mask,
                    "decoder_input_ids": torch.cat([start, target[:, :-1]], dim=1),
                    "labels": target,
                }
            )
    return out


def targets(family: str, labels: torch.Tensor) -> torch.Tensor:
    """The labels aligned to the positions they score: a causal LM scores position t against label
    t + 1 (HF's shift, written out here), and its last position against nothing."""
    if family not in CAUSAL:
        return labels
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)


def logits_of(output: Any) -> torch.Tensor:
    return output if isinstance(output, torch.Tensor) else output.logits


def forward(model: nn.Module, family: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The reference forward, by each model's own signature."""
    if family == "vit":
        return model(batch["pixel_values"])
    if family == "seq2seq":
        return model(batch["input_ids"], batch["decoder_input_ids"], src_mask=batch["attention_mask"])
    if family == "mlm":
        return model(
            batch["input_ids"], attention_mask=batch["attention_mask"], token_type_ids=batch["token_type_ids"]
        )
    return logits_of(model(batch["input_ids"]))


def moe_aux(model: nn.Module) -> torch.Tensor:
    return sum(m.aux_loss_weight * m.aux_loss for m in model.modules() if hasattr(m, "aux_loss_weight"))


def reference(
    family: str, grad_clip: float | None = None, moe: bool = False, aux_parts: int = 1
) -> dict[str, Any]:
    """A plain torch loop: mean cross-entropy over the scored positions of each global batch, SGD.

    With ``moe``, the load-balancing loss of each of ``aux_parts`` equal row blocks (what each of that
    many data-parallel ranks computes) is added, weighted by its share of the scored positions.
    """
    model = build(family, moe=moe)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for batch in global_batches(family):
        opt.zero_grad()
        labels = targets(family, batch["labels"])
        count = (labels != -100).sum()
        total = torch.zeros(())
        ce_sum = torch.zeros(())
        for part in [{k: v.chunk(aux_parts)[i] for k, v in batch.items()} for i in range(aux_parts)]:
            logits = forward(model, family, part)
            part_labels = targets(family, part["labels"])
            ce = F.cross_entropy(logits.flatten(0, -2), part_labels.flatten(), reduction="sum")
            ce_sum = ce_sum + ce.detach()
            total = total + ce
            if moe:
                total = total + moe_aux(model) * (part_labels != -100).sum()
        (total / count).backward()
        if grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(float(ce_sum / count))
    with torch.no_grad():
        batch = global_batches(family)[0]
        logits = forward(model, family, batch)
        held_out = F.cross_entropy(logits.flatten(0, -2), targets(family, batch["labels"]).flatten())
    state = {k: v.detach().clone() for k, v in full_state_dict(model).items()}  # the real vocabulary
    return {"losses": losses, "state": state, "eval": float(held_out)}


def share(model: nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """This data-parallel rank's rows; pipeline ranks past the first pass None and receive them."""
    state = parallel_state(model)
    if state.mesh["pp"].get_local_rank() > 0:
        return None
    dp, rank = state.config.data_parallel_size, state.mesh["dp"].get_local_rank()
    rows = split_rows(batch["labels"].shape[0], None, dp)
    start = sum(rows[:rank])
    return {k: v[start : start + rows[rank]] for k, v in batch.items()}


@contextlib.contextmanager
def head_calls(model: nn.Module) -> Iterator[dict[str, int]]:
    """While inside: how often the fused head loss ran (``fused``: DecoderLM's kernel calls) and how
    often ``model.lm_head`` made logits (``logits``), counted by a spy on each; ``weights``: the
    distinct (type, shape) of the head weights the kernel was given."""
    calls: dict[str, Any] = {"fused": 0, "logits": 0, "weights": []}
    kernel = decoder_lm.fused_linear_cross_entropy

    def fused(hidden: torch.Tensor, weight: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls["fused"] += 1
        seen = [type(weight).__name__, list(weight.shape)]
        if seen not in calls["weights"]:
            calls["weights"].append(seen)
        return kernel(hidden, weight, *args, **kwargs)

    def logits(*_: Any) -> None:
        calls["logits"] += 1

    head = getattr(model, "lm_head", None)
    hook = head.register_forward_hook(logits) if isinstance(head, nn.Module) else None
    try:
        with mock.patch.object(decoder_lm, "fused_linear_cross_entropy", fused):
            yield calls
    finally:
        if hook is not None:
            hook.remove()


def train_layouts(cases: list[tuple[str, str, dict[str, Any]]]) -> dict[str, Any]:
    """On every rank: for each (key, family, dist dict + test keys), parallelize, take STEPS TrainSteps.

    Test keys: ``grad_accum_steps``, ``grad_clip``, ``precision``, ``moe``, ``callable`` (the task as a user's
    function). A case that raises records its message.
    """
    out: dict[str, Any] = {}
    for key, family, layout in cases:
        layout = dict(layout)
        options = {k: layout.pop(k) for k in ("grad_accum_steps", "grad_clip", "precision") if k in layout}
        moe = layout.pop("moe", False)
        as_callable = layout.pop("callable", False)
        try:
            model = build(family, moe=moe)
            with head_calls(model) as calls:  # spied before parallelize, which may move the head
                model = parallelize(model, layout)  # an HF GPT-2's plan comes from factory/hf/gpt2.py
                opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                task = TASKS[TASK[family]]
                step = TrainStep(
                    model,
                    opt,
                    (lambda m, b, t=task: t(m, t.align(b))) if as_callable else task.name,
                    **options,
                )
                losses, counts = [], []
                for batch in global_batches(family):
                    losses.append(step(share(model, batch)))
                    counts.append(step.metrics.get("expert_counts"))
                held_out = evaluate(model, [share(model, global_batches(family)[0])], step.task)
            out[key] = {
                "losses": losses,
                "state": full_state_dict(model),
                "expert_counts": counts,
                "eval": held_out,
                "head_calls": calls,
            }
        except (ValueError, TypeError) as error:
            out[key] = {"error": f"{type(error).__name__}: {error}"}
        dist.barrier()
    return out


def check(per_rank: list[dict[str, Any]], key: str, ref: dict[str, Any], tol: float = 1e-5) -> None:
    got = per_rank[0][key]
    assert "error" not in got, got.get("error")
    for other in per_rank[1:]:
        assert other[key]["losses"] == got["losses"], "ranks returned different losses"
    for step, (loss, want) in enumerate(zip(got["losses"], ref["losses"], strict=True)):
        assert abs(loss - want) <= tol * abs(want), f"step {step}: loss {loss} vs the plain loop's {want}"
    if "eval" in ref:
        assert abs(got["eval"] - ref["eval"]) <= tol * ref["eval"], f"evaluate {got['eval']} vs {ref['eval']}"
    assert got["state"].keys() == ref["state"].keys()
    for name, want in ref["state"].items():
        torch.testing.assert_close(
            got["state"][name], want, rtol=0, atol=tol, msg=f"{name} after {STEPS} steps"
        )


def mismatched_tp_batches(family: str) -> str:
    """Each rank of a tp2 pair passes its own batch; the message of the error every rank gets."""
    model = parallelize(build(family), {"tensor_parallel_size": 2})
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), TASK[family])
    batch = global_batches(family)[dist.get_rank()]
    try:
        step(batch)
    except ValueError as error:
        return str(error)
    return "no error"


def labels_under_tensor_parallel() -> str:
    """The error of asking a tp2 decoder, whose head is split over the vocabulary, for its fused loss."""
    model = parallelize(build("decoder"), {"tensor_parallel_size": 2})
    batch = global_batches("decoder")[0]
    try:
        model(batch["input_ids"], labels=batch["labels"])
    except ValueError as error:
        return str(error)
    return "no error"


def fp16_overflow(layout: dict[str, Any], overflow_at: int) -> dict[str, Any]:
    """fp16 steps of the decoder, the step ``overflow_at`` forced to overflow: what each step did."""
    model = parallelize(build("decoder"), layout)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = {"step": 0}

    def task(module: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logits = logits_of(module(batch["input_ids"]))[:, :-1]
        labels = batch["labels"][:, 1:]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")
        blow_up = 1e38 if calls["step"] == overflow_at else 1.0
        return loss * blow_up, labels.numel()

    step = TrainStep(model, opt, task, precision="fp16")
    record = []
    for index, batch in enumerate(global_batches("decoder")):
        calls["step"] = index
        before = full_state_dict(model)
        step(share(model, batch))
        after = full_state_dict(model)
        changed = any(not torch.equal(before[k], after[k]) for k in before)
        record.append(
            {"skipped": step.metrics["skipped"], "changed": changed, "scale": step.metrics["loss_scale"]}
        )
    return {"record": record}


def run_world(cases: list[tuple[str, str, dict[str, Any]]], extras: bool) -> dict[str, Any]:
    """Everything one spawned world checks: the layouts, and with ``extras`` (2 ranks) the fp16
    overflow under dp2, ZeRO-3 and tp2, the tp2 batch mismatch and the tp2 decoder asked for its
    fused loss."""
    out = {"layouts": train_layouts(cases)}
    if extras:
        fp16_layouts = {
            "dp2": {"data_parallel_size": 2},
            "zero3": {"data_parallel_size": 2, "zero_stage": 3},
            "tp2": {"tensor_parallel_size": 2},
        }
        out["fp16"] = {name: fp16_overflow(lay, overflow_at=1) for name, lay in fp16_layouts.items()}
        out["mismatch"] = mismatched_tp_batches("decoder")
        out["labels_under_tp"] = labels_under_tensor_parallel()
    return out
