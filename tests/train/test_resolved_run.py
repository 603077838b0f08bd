"""The run ``brickwork train`` resolves once per process (brickwork/train/run.py): its spec is the one the
model is built from and carries, and config.yaml's ``dist:`` is the checked dist dict from before
``train.device`` and FSDP's bf16 policy are folded into the run's layout."""

from __future__ import annotations

import dataclasses

import pytest

from brickwork.data.tokenizer import ByteTokenizer
from brickwork.factory import build_model
from brickwork.train.run import resolve, run_task, with_auto_dist
from brickwork.train.run_config import resolve_run

SMALL = ["dim_model=32", "encoder.num_layers=1", "encoder.block.attention.num_heads=2"]
OVERRIDES = {
    "bert-base": [*SMALL, "encoder.block.feedforward.hidden_dim=64"],
    "vit": [*SMALL, "encoder.block.feedforward.hidden_dim=64", "image_size=16", "patch_size=4"],
}


@pytest.mark.parametrize("preset", sorted(OVERRIDES))
def test_the_resolved_spec_is_the_one_the_model_carries(preset: str) -> None:
    config = resolve_run(preset, OVERRIDES[preset])
    task = run_task(config)
    run = resolve(with_auto_dist(config, task), task)
    # config.yaml is written from the run before the model exists: every default is filled in already.
    assert build_model(run.config.spec).spec == run.config.spec
    assert build_model(config.spec).spec != config.spec
    if task.uses_tokenizer:  # bert-base's 30522 ids become the bytes' 256 and the [MASK] id
        vocab = (config.spec["vocab_size"], run.config.spec["vocab_size"])
        assert vocab == (30522, ByteTokenizer().vocab_size + 1)


def test_config_yaml_records_the_dist_dict_before_the_train_settings_join_the_layout() -> None:
    config = resolve_run("gpt-tiny", ["train.device=cpu", "train.precision=bf16-mixed", "dist.zero_stage=3"])
    run = resolve(config, run_task(config))
    written = run.config.to_dict()["dist"]
    assert (written["zero_stage"], written["device_type"], written["mixed_precision"]) == (3, None, "fp32")
    assert (run.layout.device_type, run.layout.mixed_precision) == ("cpu", "bf16")
    assert dataclasses.replace(run.layout, device_type=None, mixed_precision="fp32").to_dict() == written
    # Each step of the resolution is a replace: the config it started from is as it was given.
    assert config.dist == {"zero_stage": 3}
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.config.dist = written  # type: ignore[misc]
    # ... and so are its sections: the derived defaults are filled while the config is built.
    assert run.config.train.warmup_steps == run.config.train.steps // 20
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.config.train.lr = 1.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.config.data.path = "elsewhere"  # type: ignore[misc]


def test_a_new_run_reads_its_tokenizer_once(tmp_path, monkeypatch) -> None:
    # The run holds its data's tokenizer: resolving the spec, the checks before writing and the data
    # take that one (a tokenizer.json of a large vocabulary takes a while to read).
    from brickwork.cli import main
    from brickwork.train import run_data

    declared, reads = run_data.declared_tokenizer, []
    monkeypatch.setattr(run_data, "declared_tokenizer", lambda *a: reads.append(a) or declared(*a))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "gpt-tiny", "train.steps=1", "train.eval_batches=1", "train.sample_tokens=0"]) == 0
    assert len(reads) == 1
