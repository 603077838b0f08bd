"""``brickwork train`` end to end, as a subprocess: the run folder, overrides, config.yaml and resume."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cli_runs import SMALL, check_ok, curve, read_metrics, run_cli
from safetensors import safe_open
from safetensors.torch import load_file

from brickwork.data import ByteTokenizer, fixed_windows, read_corpus, split_tokens
from brickwork.factory import build_model, get_preset, load_spec
from brickwork.parallel import export

pytestmark = pytest.mark.slow

# Dropout makes every step draw random numbers, so resume must restore the RNG to match.
OVERRIDES = [
    "decoder.num_layers=2",
    "dim_model=64",
    "dropout=0.1",
    "decoder.block.feedforward.dropout=0.1",
    "train.lr=2e-3",
    "train.schedule=linear",
    "train.seed=5",
]


@pytest.fixture(scope="module")
def default_run(workdir: Path) -> tuple[Path, str]:
    out = check_ok(run_cli(["train", *SMALL, "train.out_dir=default"], workdir))
    return workdir / "default", out


@pytest.fixture(scope="module")
def user_text(workdir: Path) -> Path:
    lines = [
        f"Line {i}: the {c} cat sat on the {d} mat."
        for i, (c, d) in enumerate(zip("abcdefgh" * 40, "xyz" * 107))
    ]
    path = workdir / "mine.txt"
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def override_run(workdir: Path, user_text: Path) -> tuple[Path, str]:
    args = ["train", "gpt-tiny", *SMALL, *OVERRIDES, f"data.path={user_text}", "train.out_dir=overrides"]
    return workdir / "overrides", check_ok(run_cli(args, workdir))


def final_val_loss(run_dir: Path) -> float:
    return [r["val_loss"] for r in read_metrics(run_dir) if "val_loss" in r][-1]


def exported(checkpoint: Path) -> Path:
    """A checkpoint's weights as one single-process safetensors file beside it."""
    return export(checkpoint, checkpoint.parent / f"{checkpoint.name}.safetensors")


def held_out_loss(spec: dict, weights: Path, data_path: str | None, seq_len: int, windows: int) -> float:
    """The validation loss recomputed here from the saved weights and the same held-out windows."""
    model = build_model(spec)
    model.load_state_dict(load_file(weights), strict=True)
    model.eval()
    data, _ = read_corpus(data_path)
    _, val = split_tokens(ByteTokenizer().encode(data), 0.1, seq_len)
    x, _ = fixed_windows(val, windows, seq_len)
    with torch.no_grad():
        logits = model(x)
    # HF's causal-LM labels: the validation batches score position t against token t + 1 of the window.
    return F.cross_entropy(logits[:, :-1].double().flatten(0, 1), x[:, 1:].flatten()).item()


def test_default_run_writes_a_complete_run_folder(default_run):
    run_dir, out = default_run
    assert "run folder default" in out
    assert "step 0/6  val loss" in out and "step 6/6  train loss" in out
    assert "sample (24 tokens after the prompt, temperature 0.8):" in out
    sample = out.split("temperature 0.8):\n", 1)[1]
    # The prompt is the start of the held-out text: a quarter of the 32-byte window.
    data, _ = read_corpus(None)
    _, val = split_tokens(ByteTokenizer().encode(data), 0.1, 32)
    assert sample.startswith(ByteTokenizer().decode(val[:8]))
    records = read_metrics(run_dir)
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3, 4, 5, 6]
    vals = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert list(vals) == [0, 3, 6]
    # Before training a byte model is near uniform over 256 values; six steps already beat it clearly.
    assert abs(vals[0] - math.log(256)) < 0.3
    assert vals[6] < vals[0] - 0.5
    assert all(r["tokens_per_s"] > 0 for r in records if "loss" in r)
    assert (run_dir / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for step in (3, 6):
        folder = run_dir / "checkpoints" / f"step_{step:06d}"
        # A brickwork.parallel checkpoint: DCP's files, this process's RNG, the metadata, the
        # checksums, the marker.
        assert sorted(p.name for p in folder.iterdir()) == [
            ".complete",
            ".metadata",
            "__0_0.distcp",
            "manifest.json",
            "meta.json",
            "rng",
        ]
        assert [p.name for p in (folder / "rng").iterdir()] == ["rank0.pt"]


def test_checkpoint_holds_the_weights_that_scored_the_validation_loss(default_run):
    run_dir, _ = default_run
    config = load_spec(run_dir / "config.yaml")
    spec = {k: v for k, v in config.items() if k not in ("train", "data", "dist")}
    weights = exported(run_dir / "checkpoints" / "step_000006")
    recomputed = held_out_loss(spec, weights, None, seq_len=32, windows=8)
    assert recomputed == pytest.approx(final_val_loss(run_dir), abs=1e-5)


def test_export_command_writes_the_newest_checkpoint_as_one_file(default_run, workdir):
    run_dir, _ = default_run
    out = check_ok(run_cli(["export", str(run_dir), "default.safetensors"], workdir))
    assert f"wrote default.safetensors: the weights of {run_dir / 'checkpoints' / 'step_000006'}" in out
    with safe_open(workdir / "default.safetensors", "pt") as handle:
        metadata = handle.metadata()
    spec = json.loads(metadata["spec"])
    assert metadata["step"] == "6"
    assert spec == {
        k: v for k, v in load_spec(run_dir / "config.yaml").items() if k not in ("train", "data", "dist")
    }
    recomputed = held_out_loss(spec, workdir / "default.safetensors", None, seq_len=32, windows=8)
    assert recomputed == pytest.approx(final_val_loss(run_dir), abs=1e-5)


def test_config_yaml_is_fully_resolved(default_run):
    run_dir, _ = default_run
    config = load_spec(run_dir / "config.yaml")
    spec = {k: v for k, v in config.items() if k not in ("train", "data", "dist")}
    assert spec == build_model(get_preset("gpt-tiny")).spec
    assert config["train"]["steps"] == 6 and config["train"]["warmup_steps"] is None  # 5% of steps
    assert config["train"]["lr"] == 3e-3 and config["train"]["schedule"] == "cosine"
    assert config["data"] == {
        "path": None,
        "format": "auto",
        "text_key": "text",
        "tokenizer": None,
        "val_path": None,
        "val_fraction": 0.1,
        "pack": False,
    }
    assert config["dist"]["data_parallel_size"] == 1 and config["dist"]["zero_stage"] == 0


def test_overrides_reach_the_model_the_schedule_and_the_data(override_run, user_text):
    run_dir, out = override_run
    config = load_spec(run_dir / "config.yaml")
    assert config["decoder"]["num_layers"] == 2 and config["dim_model"] == 64 and config["dropout"] == 0.1
    assert config["decoder"]["block"]["feedforward"]["dropout"] == 0.1
    assert config["train"]["lr"] == 2e-3 and config["train"]["seed"] == 5
    assert config["data"]["path"] == str(user_text)
    spec = {k: v for k, v in config.items() if k not in ("train", "data", "dist")}
    assert f"{sum(p.numel() for p in build_model(spec).parameters()):,} parameters" in out
    assert f"data: {user_text}" in out
    # Linear decay from lr to min_lr over six steps with no warmup.
    lrs = [r["lr"] for r in read_metrics(run_dir) if "lr" in r]
    assert lrs == pytest.approx([2e-3 - (2e-3 - 3e-4) * s / 5 for s in range(6)])
    weights = exported(run_dir / "checkpoints" / "step_000006")
    assert held_out_loss(spec, weights, str(user_text), 32, 8) == pytest.approx(
        final_val_loss(run_dir), abs=1e-5
    )


def test_config_yaml_reproduces_the_run(override_run, workdir):
    run_dir, _ = override_run
    again = workdir / "again"
    check_ok(run_cli(["train", str(run_dir / "config.yaml"), f"train.out_dir={again}"], workdir))
    assert curve(again) == curve(run_dir)


def test_resume_continues_the_same_curve(override_run, workdir):
    run_dir, _ = override_run
    cut = workdir / "cut"
    shutil.copytree(run_dir, cut)
    # The run "died" while saving step 6: its folder exists but has no marker, so step 3 is resumed.
    (cut / "checkpoints" / "step_000006" / ".complete").unlink()
    (cut / "checkpoints" / "step_000006" / "__0_0.distcp").unlink()
    out = check_ok(run_cli(["train", "--resume", str(cut)], workdir))
    assert f"resuming {cut} from step 3 of 6" in out
    assert "continuing as" not in out  # the same layout
    assert curve(cut) == curve(run_dir)
    final = Path("checkpoints/step_000006")
    expected, resumed = load_file(exported(run_dir / final)), load_file(exported(cut / final))
    assert expected.keys() == resumed.keys()
    assert all(torch.equal(expected[k], resumed[k]) for k in expected)
