"""User mistakes end in one line that names the fix, never a traceback."""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

import pytest
import torch
from cli_runs import SMALL, run_cli

import brickwork
from brickwork.cli import main
from brickwork.factory import dump_spec, get_preset
from brickwork.train.threads import cpu_threads


def error_line(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["gpt-tin"],
            "SPEC: 'gpt-tin' is neither a preset nor a .yaml/.json file; allowed: .*did you mean 'gpt-tiny'",
        ),
        (["missing.yaml"], "SPEC: spec file 'missing.yaml' does not exist"),
        (["decoder.num_layer=2"], "decoder.num_layer: unknown key 'num_layer'.*did you mean 'num_layers'"),
        (["train.stpes=3"], "train.stpes: unknown key 'stpes'.*did you mean 'steps'"),
        (["train.steps=many"], "train.steps: expected int, got str 'many'"),
        (["train.lr=-1"], "train.lr: must be a number > 0"),
        (["gpt-tiny", "oops"], "expected a dotted key=value override after SPEC, got 'oops'"),
        (["data.path=nope.txt"], "data.path: file or folder 'nope.txt' does not exist"),
        (["dist.data_parallel_size=2"], "asks for 2 processes .* launch it with torchrun --nproc_per_node 2"),
        (["train.seq_len=512"], "train.seq_len: 512 is longer than max_seq_len=256"),
        (["vit", "num_classes=0"], "num_classes: an image encoder trains as a classifier"),
        (["bert-base", "head=none"], "head: an encoder trains as a masked LM, which needs head: mlm"),
        (["train.precision=fp4"], "train.precision: unknown value 'fp4'.*bf16-mixed.*fp8"),
        (["train.grad_accum_steps=0"], "train.grad_accum_steps: must be a positive integer"),
    ],
)
def test_bad_train_arguments(capsys, tmp_path, monkeypatch, args, expected):
    monkeypatch.chdir(tmp_path)
    assert re.search(expected, error_line(capsys, ["train", *args]))


def test_data_file_empty_or_too_short(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("empty.txt").write_text("")
    assert "data.path: file 'empty.txt' is empty" in error_line(capsys, ["train", "data.path=empty.txt"])
    Path("short.txt").write_text("only a few words")
    err = error_line(capsys, ["train", "data.path=short.txt", "train.seq_len=64"])
    assert (
        "data.path: 'short.txt' has 16 bytes, too short for train.seq_len=64" in err
        and "at least 130 bytes" in err
    )


def test_resume_needs_a_run_folder_and_continues_only_as_its_config_says(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("run/checkpoints/step_000004").mkdir(parents=True)
    assert "--resume: 'run' is not a run folder: it has no config.yaml" in error_line(
        capsys, ["train", "--resume", "run"]
    )
    Path("run/config.yaml").write_text("model: decoder_lm\n")
    # With no complete checkpoint the run starts again from step 0: its config.yaml is checked as a new run's.
    err = error_line(capsys, ["train", "--resume", "run"])
    assert "dim_model: missing required key" in err
    err = error_line(capsys, ["train", "--resume", "run", "dim_model=64"])
    assert "dim_model: cannot change on --resume: the checkpoint holds the weights" in err
    # dist.* overrides change the layout on resume, and they must fit the processes launched.
    Path("run/checkpoints/step_000004/.complete").write_text("complete\n")
    dump_spec({**get_preset("gpt-tiny"), "dist": {"data_parallel_size": 2}}, Path("run/config.yaml"))
    err = error_line(capsys, ["train", "--resume", "run", "dist.tensor_parallel_size=2"])
    assert "dist: the dist dict asks for 4 processes" in err
    assert "or continue under another layout with dist.* overrides after --resume run" in err
    # A new run refuses a folder that holds one.
    err = error_line(capsys, ["train", "train.out_dir=run"])
    assert "train.out_dir: 'run' already holds a run; continue it with --resume run" in err


def test_export_needs_a_complete_checkpoint_and_a_safetensors_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = error_line(capsys, ["export", "nowhere", "out.safetensors"])
    assert err.endswith("error: RUN_DIR: 'nowhere' is not a folder; give a run folder or a checkpoint in it")
    Path("run/checkpoints/step_000003").mkdir(parents=True)
    err = error_line(capsys, ["export", "run", "out.safetensors"])
    assert "RUN_DIR: 'run' has no complete checkpoint (no checkpoints/step_*/.complete)" in err
    err = error_line(capsys, ["export", "run", "out.pt"])
    assert "OUT: must be a file name ending in .safetensors, got 'out.pt'" in err
    assert not Path("out.safetensors").exists()


def test_errors_from_the_installed_command_are_one_line(tmp_path):
    result = run_cli(["train", "gpt-tiny", *SMALL, "decoder.num_layers=0"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert result.stderr.startswith("brickwork train: error: decoder.num_layers")
    assert not (tmp_path / "runs").exists()


def test_world_size_must_match_the_dist_dict(tmp_path):
    result = run_cli(
        ["train", *SMALL, "dist.tensor_parallel_size=2", "dist.data_parallel_size=2"], tmp_path, nproc=2
    )
    assert result.returncode != 0
    assert (
        result.stderr.count(
            "brickwork train: error: dist: torchrun started 2 processes, but the dist dict asks for 4"
        )
        == 1
    )


def test_info_lists_versions_backends_components_and_presets(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for name in ("torch", "triton", "transformers", "safetensors", "numpy", "tokenizers"):
        # The installed distribution's own version, as pip reports it.
        assert re.search(rf"^  {name} +{re.escape(importlib.metadata.version(name))}$", out, re.M), name
    assert f"brickwork     {brickwork.__version__}" in out
    threads = cpu_threads()  # what brickwork train would set, not only torch's count
    assert f"{os.cpu_count()} cores; brickwork train computes with {threads.threads} thread" in out
    assert f"({threads.reason}; torch's count here: {torch.get_num_threads()})" in out
    for text in (
        "CUDA ",
        "layer_norm",
        "masked_softmax",
        "scaled_dot_product",
        "swiglu",
        "rotary",
        "rmsnorm",
        "deepnorm",
        "gpt-tiny",
        "llama",
    ):
        assert text in out


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"brickwork {brickwork.__version__}"
