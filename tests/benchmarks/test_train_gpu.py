"""The GPU training benchmark in its CPU form: every row runs, every row trains the same problem, and
the ratios and targets are computed from the rows."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from brickwork.benchmarks import train_gpu
from brickwork.benchmarks.train_gpu_report import add_ratios, markdown, verdicts
from brickwork.benchmarks.train_gpu_rows import IMPLEMENTATIONS, Row, Settings, cli_overrides
from brickwork.benchmarks.train_gpu_shapes import GPT2_TINY, TINY_SHAPES
from brickwork.factory import build_model

CUDA = torch.cuda.is_available()
MODES = ("eager", "compiled") if CUDA else ("eager",)


def run(out: Path, *args: str) -> dict:
    """The benchmark's tiny form with two timed steps a row; its JSON results, and the Markdown as
    ``markdown``."""
    assert train_gpu.main(["--tiny", "--steps", "2", "--warmup", "1", "--out", str(out), *args]) == 0
    (written,) = out.glob("train_gpu_*_tiny.json")
    return {**json.loads(written.read_text()), "markdown": Path(str(written)[: -len(".json")] + ".md")}


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run(tmp_path_factory.mktemp("train_gpu"))


def test_every_row_is_measured_and_written(cpu_run: dict) -> None:
    names = [f"{s.name}/{i}/{m}" for s in TINY_SHAPES for i in IMPLEMENTATIONS for m in MODES]
    rows = cpu_run["rows"]
    assert [r["row"] for r in rows] == names
    assert cpu_run["scale"] == "tiny" and (cpu_run["steps"], cpu_run["warmup"]) == (2, 1)
    for row in rows:
        assert "error" not in row, row["row"]
        assert row["tokens_per_s"] > 0 and row["wall_s"] > 0
        tokens = GPT2_TINY.tokens  # both tiny shapes train 2 x 32 tokens a step
        assert row["step_ms"] == pytest.approx(1e3 * tokens / row["tokens_per_s"])
    table = cpu_run["markdown"].read_text()
    assert all(f"| {name} |" in table for name in names)


def test_every_row_trains_the_same_problem(cpu_run: dict) -> None:
    # At random weights (std 0.02) the logits are near zero: the first loss is near ln(vocabulary)
    # for every implementation of a shape, whatever its loop, if they train the same problem.
    rows = [r for r in cpu_run["rows"] if "error" not in r]
    for shape in TINY_SHAPES:
        losses = [r["first_loss"] for r in rows if r["shape"] == shape.name]
        assert len(losses) >= 3
        assert max(abs(loss - math.log(shape.vocab)) for loss in losses) < 0.1, losses


@pytest.mark.parametrize("shape", TINY_SHAPES, ids=lambda s: s.name)
def test_the_plain_model_has_brickworks_weights_shapes(shape) -> None:
    def shapes(model: torch.nn.Module) -> list[tuple[int, ...]]:
        return sorted(tuple(p.shape) for p in model.parameters())

    # Up to the rows brickwork may pad its vocabulary with inside (vocab_multiple), the same weights.
    unpadded = {**shape.spec(), "vocab_multiple": 1}
    assert shapes(shape.plain_model()) == shapes(build_model(unpadded))


def test_ratios_are_the_rows_own(cpu_run: dict) -> None:
    rows = {r["row"]: r for r in cpu_run["rows"]}
    for shape in TINY_SHAPES:
        plain = rows[f"{shape.name}/plain/eager"]
        assert "x_plain" not in plain
        for implementation in ("brickwork", "fp8", "packed", "cli"):
            row = rows[f"{shape.name}/{implementation}/eager"]
            assert row["x_plain"] == pytest.approx(row["tokens_per_s"] / plain["tokens_per_s"])
        fp8, bf16 = rows[f"{shape.name}/fp8/eager"], rows[f"{shape.name}/brickwork/eager"]
        assert fp8["x_bf16"] == pytest.approx(fp8["tokens_per_s"] / bf16["tokens_per_s"])
        packed = rows[f"{shape.name}/packed/eager"]
        assert packed["x_unpacked"] == pytest.approx(packed["tokens_per_s"] / bf16["tokens_per_s"])
    # Judged on CUDA at the full shapes only; a CPU run lists the targets without a verdict.
    assert cpu_run["targets"] and all(line["met"] is None for line in cpu_run["targets"])


def synthetic(implementation: str, mode: str, tokens_per_s: float, peak_gib: float) -> dict:
    return {"row": f"gpt2-small/{implementation}/{mode}", "shape": "gpt2-small", "family": "gpt2",
            "implementation": implementation, "mode": mode, "tokens_per_s": tokens_per_s, "step_ms": 1.0,
            "peak_gib": peak_gib, "first_loss": 10.8, "wall_s": 1.0}  # fmt: skip


def test_targets_judge_each_covered_row() -> None:
    rows = [
        synthetic("plain", "eager", 200.0, 16.0),
        synthetic("plain", "compiled", 400.0, 8.0),
        synthetic("brickwork", "eager", 300.0, 8.0),  # 1.5x eager: met; memory 1.0x: met
        synthetic("brickwork", "compiled", 380.0, 9.0),  # 0.95x: not met; memory 1.125x: not met
        synthetic("cli", "eager", 280.0, 7.0),  # 1.4x: met
        {**synthetic("cli", "compiled", 0.0, 0.0), "error": "ConfigError: train.compile: unknown key"},
    ]
    add_ratios(rows)
    assert rows[3]["compiled_x_eager"] == pytest.approx(380 / 300)
    assert rows[1]["compiled_x_eager"] == pytest.approx(2.0)
    lines = {(line["target"][:20], line["row"]): line for line in verdicts(rows, judged=True)}
    met = {key: line["met"] for key, line in lines.items()}
    assert met == {
        ("brickwork train comp", "gpt2-small/cli/compiled"): None,  # failed: no ratio to judge
        ("brickwork model comp", "gpt2-small/brickwork/compiled"): False,
        ("eager brickwork >= 1", "gpt2-small/brickwork/eager"): True,
        ("eager brickwork >= 1", "gpt2-small/cli/eager"): True,
        ("brickwork peak memor", "gpt2-small/brickwork/eager"): True,
        ("brickwork peak memor", "gpt2-small/brickwork/compiled"): False,
        ("brickwork peak memor", "gpt2-small/cli/eager"): True,
        ("brickwork peak memor", "gpt2-small/cli/compiled"): None,
    }
    metadata = {"device": "NVIDIA H100 80GB HBM3", "timestamp": "t", "torch": "2", "scale": "full",
                "precision": "bf16-mixed", "warmup": 5, "steps": 10, "mfu_convention": "6N",
                "targets_judged": True}  # fmt: skip
    table = markdown(metadata, rows, verdicts(rows, judged=True))
    target = "brickwork model compiled, bare loop >= 1.0x plain compiled"
    assert f"| {target} | gpt2-small/brickwork/compiled | 0.95 | **no** |" in table
    assert "| gpt2-small/cli/compiled | failed: ConfigError: train.compile: unknown key |" in table


def test_mfu_is_brickwork_trains_and_unknown_on_a_cpu(cpu_run: dict) -> None:
    if CUDA:
        pytest.skip("on CUDA the MFU of a known board is a number")
    assert cpu_run["peak_flops"] is None and "no peak FLOP/s is known for cpu" in cpu_run["mfu_unknown"]
    assert all(row.get("mfu") is None for row in cpu_run["rows"])


def test_cli_rows_set_train_compile_both_ways(tmp_path: Path) -> None:
    # Its default (auto) compiles on CUDA: the eager row must say false.
    settings = Settings(torch.device("cpu"), 1, 2, "fp32", tmp_path)
    for mode, value in (("eager", "false"), ("compiled", "true")):
        overrides = cli_overrides(Row(GPT2_TINY, "cli", mode), settings, tmp_path, tmp_path / "run", 22)
        assert [o for o in overrides if o.startswith("train.compile=")] == [f"train.compile={value}"]


def test_rows_are_selected_by_pattern() -> None:
    every = train_gpu.select_rows(TINY_SHAPES, ["*"], compiled=True)
    assert len(every) == 20 and every[0] == Row(TINY_SHAPES[0], "plain", "eager")
    eager = train_gpu.select_rows(TINY_SHAPES, ["llama*"], compiled=False)
    assert [r.name for r in eager] == [f"llama-tiny/{i}/eager" for i in IMPLEMENTATIONS]


@pytest.mark.slow
def test_compiled_rows_train_like_the_eager_ones(tmp_path: Path) -> None:
    # The fp8 rows left out: Inductor's C++ build of their float8 casts costs more than the rest.
    patterns = [f"gpt2*/{implementation}/*" for implementation in ("plain", "brickwork", "cli")]
    rows = {r["row"]: r for r in run(tmp_path, "--cpu-compile", "--rows", *patterns)["rows"]}
    assert len(rows) == 6
    for implementation in ("plain", "brickwork", "cli"):
        compiled = rows[f"gpt2-tiny/{implementation}/compiled"]
        assert "error" not in compiled, compiled["error"]
        eager = rows[f"gpt2-tiny/{implementation}/eager"]
        # The same weights and first batch: compiling changes the kernels, not the loss.
        assert compiled["first_loss"] == pytest.approx(eager["first_loss"], abs=1e-4)
        assert compiled["compiled_x_eager"] == pytest.approx(compiled["tokens_per_s"] / eager["tokens_per_s"])


def test_a_run_stopped_midway_keeps_the_rows_it_finished(tmp_path: Path, monkeypatch) -> None:
    measured = []

    def measure(row: Row, settings: Settings) -> dict:
        if measured:
            raise KeyboardInterrupt  # a time limit's kill, after the first row
        measured.append(row.name)
        names = {"row": row.name, "shape": row.shape.name, "family": row.shape.preset}
        return {**names, "implementation": row.implementation, "mode": row.mode, "error": "x", "wall_s": 1.0}

    monkeypatch.setattr(train_gpu, "measure", measure)
    with pytest.raises(KeyboardInterrupt):
        train_gpu.main(["--tiny", "--steps", "1", "--warmup", "1", "--out", str(tmp_path)])
    (written,) = tmp_path.glob("train_gpu_*_tiny.json")
    assert [r["row"] for r in json.loads(written.read_text())["rows"]] == measured
