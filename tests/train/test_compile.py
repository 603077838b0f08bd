"""Regional compile (parallel/compile.py) through the one training step and ``brickwork train``.

Compiled training equals eager training in fp32 (1e-5) for a decoder and an encoder in one process and
under tensor parallel and FSDP on two gloo ranks, each layer compiles as one graph (``fullgraph=True``
raises on any graph break), nothing recompiles after the first step however many evaluations follow,
and what cannot compile is refused by name before anything changes. Inductor builds the graphs (C++
on the CPU), so the models are train_cases' two-layer ones.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from train_cases import FAMILIES, check, global_batches, reference, share, spec

from brickwork.cli import main
from brickwork.errors import ConfigError
from brickwork.factory import build_model
from brickwork.parallel import ParallelConfig, full_state_dict, parallelize, spawn
from brickwork.parallel.compile import check_compilable, compile_regions, is_compiled
from brickwork.train import TrainStep, evaluate

TASK = {"decoder": "causal_lm", "mlm": "masked_lm", "seq2seq": "seq2seq", "vit": "image_classification"}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    # Every layer of every model shares Block.forward's compile cache: one model's graphs per test.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_run(family: str, layout: dict[str, Any] | None = None) -> dict[str, Any]:
    """train_cases' reference run, through TrainStep with compile=True (after ``layout``, if any)."""
    torch.manual_seed(0)
    model = build_model(spec(family))
    if layout is not None:
        model = parallelize(model, layout, compile=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = TrainStep(model, opt, TASK[family], compile=True)
    rows = share if layout is not None else (lambda m, b: b)
    losses = [step(rows(model, batch)) for batch in global_batches(family)]
    held_out = evaluate(model, [rows(model, global_batches(family)[0])], TASK[family])
    return {"losses": losses, "state": full_state_dict(model), "eval": held_out, "compiled": step.compiled}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", ["decoder", "mlm"])
def test_compiled_training_equals_eager_in_one_process(family: str) -> None:
    got = compiled_run(family)
    assert got["compiled"]
    check([{family: got}], family, reference(family))


def test_the_regions_are_the_layers_and_names_stay_the_same() -> None:
    model = build_model(spec("seq2seq"))
    names = list(model.state_dict())
    step = TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), "seq2seq", compile=True)
    layers = [*model.encoder_layers, *model.decoder_layers]
    assert compile_regions(model) == layers
    assert all(type(layer.forward).__name__ != "method" for layer in layers)  # each forward is compiled
    assert list(model.state_dict()) == names
    assert step.compiled and is_compiled(model)
    TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), "seq2seq", compile=True)  # twice: a no-op


@pytest.mark.timeout(300)
def test_twenty_steps_with_evaluations_compile_once_and_never_again() -> None:
    torch.manual_seed(0)
    model = build_model(spec("decoder"))
    step = TrainStep(model, torch.optim.AdamW(model.parameters(), lr=1e-3), "causal_lm", compile=True)
    batches = global_batches("decoder")
    evaluate(model, batches[:1], "causal_lm")  # as the loop does: step 0's evaluation, then the steps
    step(batches[0])
    with torch._dynamo.config.patch(error_on_recompile=True):
        for index in range(1, 20):
            step(batches[index % len(batches)])
            if index % 5 == 0:
                evaluate(model, batches, "causal_lm")


def test_what_cannot_compile_is_refused_by_name_before_anything_changes() -> None:
    reversible = spec("decoder")
    reversible["decoder"]["reversible"] = True
    moe = spec("decoder", moe=True)
    for bad, words in [(reversible, "a reversible stack"), (moe, "mixture-of-experts")]:
        model = build_model(bad)
        before = [layer.forward for layer in model.layers]
        with pytest.raises(ConfigError, match=f"compile: {words}"):
            parallelize(model, {}, compile=True)
        with pytest.raises(ConfigError, match=f"compile: {words}"):
            TrainStep(model, torch.optim.SGD(model.parameters(), lr=0.1), "causal_lm", compile=True)
        assert [layer.forward for layer in model.layers] == before
    with pytest.raises(ConfigError, match="compile: context parallel's hooks"):
        check_compilable(build_model(spec("decoder")), ParallelConfig(context_parallel_size=2))
    laid_out = parallelize(build_model(spec("decoder")), {})
    with pytest.raises(ValueError, match="pass compile=True to parallelize"):
        TrainStep(laid_out, torch.optim.SGD(laid_out.parameters(), lr=0.1), "causal_lm", compile=True)
    with pytest.raises(TypeError, match="compile must be True or False"):
        TrainStep(build_model(spec("decoder")), torch.optim.SGD([torch.zeros(1)], lr=0.1), "causal_lm",
                  compile="yes")  # fmt: skip


RUN = [
    "train",
    "gpt-tiny",
    "decoder.num_layers=2",
    "dim_model=64",
    "train.steps=20",
    "train.batch_size=4",
    "train.seq_len=32",
    "train.eval_interval=5",
    "train.eval_batches=2",
    "train.checkpoint_interval=20",
    "train.sample_tokens=4",
    "train.out_dir=run",
]


@pytest.mark.timeout(300)
def test_brickwork_train_compiles_once_and_logs_the_compile_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    torch._dynamo.utils.counters.clear()
    assert main([*RUN, "train.compile=true"]) == 0
    out = capsys.readouterr().out
    assert out.count("compiled: the first evaluation and step took") == 1
    # One graph for the layers' evaluation (no autograd) and one for their training step, both built
    # by step 1: five evaluations and nineteen more steps added none.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 21))
    assert all(r["tokens_per_s"] > 0 for r in records if "loss" in r)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.compile=maybe"], "train.compile: must be auto, true or false, got 'maybe'"),
        (["train.compile=true", "decoder.reversible=true"], "train.compile: a reversible stack"),
    ],
)
def test_brickwork_train_refuses_a_bad_compile_choice_and_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, overrides, message
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*RUN, *overrides]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


LAYOUTS = {
    "decoder/tp2": {"tensor_parallel_size": 2},
    "decoder/zero3": {"data_parallel_size": 2, "zero_stage": 3},
}
SLOW_LAYOUTS = {
    "decoder/tp2-sp": {"tensor_parallel_size": 2, "sequence_parallel": True},
    # Selective checkpointing keeps the tensor-parallel reductions' outputs (functional collectives).
    "decoder/tp2-sp-selective-ac": {
        "tensor_parallel_size": 2,
        "sequence_parallel": True,
        "activation_checkpointing": "selective",
    },
    "decoder/pp2": {"pipeline_parallel_size": 2},
    "seq2seq/zero3-selective-ac": {
        "data_parallel_size": 2,
        "zero_stage": 3,
        "activation_checkpointing": "selective",
    },
}
assert {key.split("/")[0] for key in SLOW_LAYOUTS} <= set(FAMILIES)


def run_layouts(layouts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """On every rank: each layout compiled and trained as train_cases' reference is; errors recorded."""
    import torch.distributed as dist

    out = {}
    for key, layout in layouts.items():
        torch._dynamo.reset()
        try:
            out[key] = compiled_run(key.split("/")[0], layout)
        except (ValueError, TypeError) as error:
            out[key] = {"error": f"{type(error).__name__}: {error}"}
        dist.barrier()
    return out


@functools.cache
def two_ranks(slow: bool) -> list[dict[str, Any]]:
    return spawn(run_layouts_entry, 2, SLOW_LAYOUTS if slow else LAYOUTS, timeout=540)


def run_layouts_entry(layouts):
    from test_compile import run_layouts

    return run_layouts(layouts)


@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", list(LAYOUTS))
def test_compiled_layouts_train_like_one_eager_process(key: str) -> None:
    check(two_ranks(False), key, reference(key.split("/")[0]))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("key", list(SLOW_LAYOUTS))
def test_more_compiled_layouts_train_like_one_eager_process(key: str) -> None:
    check(two_ranks(True), key, reference(key.split("/")[0]))
