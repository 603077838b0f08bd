"""TrainStep and evaluate in one process: every task against the plain torch loop of train_cases,
gradient accumulation, the precision policy, the loss, and errors for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from train_cases import FAMILIES, build, forward, global_batches, reference

from brickwork.parallel import full_state_dict
from brickwork.train import TASKS, TrainStep, evaluate, vocab_parallel_cross_entropy


def train(family: str, **options) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = build(family)
    step = TrainStep(
        model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), TASKS_OF[family], **options
    )
    losses = [step(batch) for batch in global_batches(family)]
    return losses, full_state_dict(model)  # the real vocabulary, as the reference keeps it


TASKS_OF = {"decoder": "causal_lm", "mlm": "masked_lm", "seq2seq": "seq2seq", "vit": "image_classification"}
TASKS_OF["gpt2-hf"] = "causal_lm"


def assert_matches(got: tuple[list[float], dict], want: dict, tol: float = 1e-5) -> None:
    losses, state = got
    assert losses == pytest.approx(want["losses"], rel=tol)
    for name, value in want["state"].items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=tol, msg=name)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_task_trains_like_the_plain_loop(family: str) -> None:
    assert_matches(train(family), reference(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_accumulating_four_micro_batches_equals_one_batch_four_times_larger(family: str) -> None:
    assert_matches(train(family, grad_accum_steps=4), reference(family))


def test_clipping_is_on_the_norm_of_the_whole_gradient() -> None:
    assert_matches(train("decoder", grad_clip=0.05), reference("decoder", grad_clip=0.05))


@pytest.mark.parametrize("precision", ["bf16", "bf16-mixed"])
def test_bf16_stays_close_to_fp32(precision: str) -> None:
    losses, _ = train("decoder", precision=precision)
    assert losses == pytest.approx(reference("decoder")["losses"], rel=2e-2)


def test_fp16_overflow_skips_exactly_that_step() -> None:
    model = build("decoder")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    blow_up = {"on": False}

    def task(module, batch):
        logits = module(batch["input_ids"])[:, :-1]  # a callable task gets HF's labels: it shifts them
        labels = batch["labels"][:, 1:]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum")
        return loss * (1e38 if blow_up["on"] else 1.0), labels.numel()

    step = TrainStep(model, opt, task, precision="fp16")
    changed, skipped = [], []
    for index, batch in enumerate(global_batches("decoder")):
        blow_up["on"] = index == 1
        before = {k: v.clone() for k, v in model.state_dict().items()}
        step(batch)
        changed.append(any(not torch.equal(before[k], v) for k, v in model.state_dict().items()))
        skipped.append(step.metrics["skipped"])
    assert skipped == [False, True, False] and changed == [True, False, True]


def test_evaluate_is_the_mean_over_every_scored_position() -> None:
    model = build("mlm")
    batches = global_batches("mlm")
    with torch.no_grad():
        sums = [
            F.cross_entropy(
                forward(model, "mlm", b).flatten(0, 1).double(), b["labels"].flatten(), reduction="sum"
            )
            for b in batches
        ]
    count = sum(int((b["labels"] != -100).sum()) for b in batches)
    assert evaluate(model, batches, "masked_lm") == pytest.approx(float(sum(sums)) / count, rel=1e-6)


def test_evaluate_computes_at_the_training_precision() -> None:
    model = build("mlm")
    batches = global_batches("mlm")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        sums = [
            F.cross_entropy(
                forward(model, "mlm", b).flatten(0, 1).double(), b["labels"].flatten(), reduction="sum"
            )
            for b in batches
        ]
    count = sum(int((b["labels"] != -100).sum()) for b in batches)
    under_bf16 = evaluate(model, batches, "masked_lm", precision="bf16-mixed")
    assert under_bf16 == pytest.approx(float(sum(sums)) / count, rel=1e-6)
    in_fp32 = evaluate(model, batches, "masked_lm")  # the default: the model's dtype, no autocast
    assert under_bf16 != in_fp32
    assert evaluate(model, batches, "masked_lm", precision="fp16") == in_fp32  # no scaler to skip overflows


def test_cross_entropy_sums_in_fp32_and_counts_scored_positions() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 7, (2, 5), generator=g)
    labels[0, :2] = -100
    loss, count = vocab_parallel_cross_entropy(logits.half(), labels)
    log_probs = logits.half().double().log_softmax(-1)
    want = -sum(log_probs[b, t, labels[b, t]] for b in range(2) for t in range(5) if labels[b, t] >= 0)
    assert loss.dtype == torch.float32 and int(count) == 8
    assert float(loss) == pytest.approx(float(want), rel=1e-5)


def test_bad_arguments_raise_naming_the_value() -> None:
    model = build("decoder")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = global_batches("decoder")[0]
    with pytest.raises(ValueError, match=r"unknown task 'causal'.*causal_lm"):
        TrainStep(model, opt, "causal")
    with pytest.raises(TypeError, match="a task is a name or a callable"):
        TrainStep(model, opt, 3)
    with pytest.raises(ValueError, match="grad_accum_steps must be an integer >= 1, got 0"):
        TrainStep(model, opt, "causal_lm", grad_accum_steps=0)
    with pytest.raises(ValueError, match="grad_clip must be a positive number or None, got -1"):
        TrainStep(model, opt, "causal_lm", grad_clip=-1)
    with pytest.raises(ValueError, match=r"precision must be one of .*'fp8'.*got 'fp4'"):
        TrainStep(model, opt, "causal_lm", precision="fp4")
    step = TrainStep(model, opt, "causal_lm", grad_accum_steps=3)
    with pytest.raises(ValueError, match="a batch of 4 rows does not split into grad_accum_steps=3"):
        step(batch)
    step = TrainStep(model, opt, "causal_lm")
    with pytest.raises(TypeError, match="a batch is a dict of tensors"):
        step((batch["input_ids"], batch["labels"]))
    with pytest.raises(ValueError, match=r"missing \['labels'\], not understood \['pixel_values'\]"):
        step({"input_ids": batch["input_ids"], "pixel_values": torch.zeros(4)})
    with pytest.raises(ValueError, match="no position to learn from"):
        step({"input_ids": batch["input_ids"], "labels": torch.full_like(batch["labels"], -100)})


def test_one_process_queues_the_update_before_reading_the_loss() -> None:
    """Labels counted on the host give the step its divisor before the forward pass, so the optimizer
    is queued before the loss is read: on a GPU the device never waits for the host in between. A
    batch with nothing to score is refused before anything runs."""
    model = build("decoder")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = TrainStep(model, opt, "causal_lm")
    order: list[str] = []
    opt_step, totals = opt.step, step._global_totals
    opt.step = lambda: (order.append("optimizer"), opt_step())[1]
    step._global_totals = lambda *args: (order.append("loss read"), totals(*args))[1]
    batch = global_batches("decoder")[0]
    labels = batch["labels"].clone()
    labels[:, :3] = -100
    step({"input_ids": batch["input_ids"], "labels": labels})
    assert order == ["optimizer", "loss read"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    forward_calls = []
    model.register_forward_pre_hook(lambda *_: forward_calls.append(1))
    with pytest.raises(ValueError, match="no position to learn from"):
        step({"input_ids": batch["input_ids"], "labels": torch.full_like(labels, -100)})
    assert not forward_calls
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, before[name], rtol=0, atol=0, msg=name)


def test_tasks_are_the_four_built_in_ones() -> None:
    assert sorted(TASKS) == ["causal_lm", "image_classification", "masked_lm", "seq2seq"]


WORLD_OF_ONE = """
import torch
from brickwork.factory import build_model, get_preset
from brickwork.parallel import full_state_dict, parallelize
from brickwork.train import TrainStep
spec = get_preset("gpt-tiny"); spec["decoder"]["num_layers"] = 1
model = parallelize(build_model(spec), {})
step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), "causal_lm")
ids = torch.randint(0, 256, (2, 8))
loss = step({"input_ids": ids, "labels": ids})
same_keys = full_state_dict(model).keys() == model.state_dict().keys()
try:
    parallelize(build_model(spec), {"data_parallel_size": 2})
except ValueError as error:
    refused = "= 2, but the world size is 1" in str(error)
print(isinstance(model, torch.nn.Module), loss > 0, same_keys, refused)
"""


@pytest.mark.timeout(120)
def test_a_plain_python_process_is_a_world_of_one() -> None:
    env = {
        k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")
    }
    result = subprocess.run(
        [sys.executable, "-c", WORLD_OF_ONE], capture_output=True, text=True, timeout=100, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True", "True"]
