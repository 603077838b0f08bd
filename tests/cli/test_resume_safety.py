"""Resume refuses what it cannot continue correctly: a damaged checkpoint (falling back to the newest
intact one), a changed model, and a folder another process is training in."""

from __future__ import annotations

import pickle
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from cli_runs import SMALL, check_ok, curve, run_cli

from brickwork.checkpoint.manifest import write_manifest
from brickwork.cli import main
from brickwork.factory import load_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(workdir: Path) -> Path:
    """A finished 6-step run with checkpoints at steps 3 and 6."""
    check_ok(run_cli(["train", *SMALL, "decoder.num_layers=2", "train.out_dir=base"], workdir))
    return workdir / "base"


@pytest.fixture
def run_copy(trained: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def edit_config(run_dir: Path, key: str, value: object) -> None:
    config = load_spec(run_dir / "config.yaml")
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node[part]
    node[last] = value
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def resume_error(capsys: pytest.CaptureFixture, run_dir: Path) -> str:
    assert main(["train", "--resume", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def test_a_bit_flip_in_the_newest_checkpoint_falls_back_to_the_previous_one(
    trained: Path, run_copy: Path, workdir: Path
) -> None:
    shard = run_copy / "checkpoints" / "step_000006" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[1000:1064] = bytes(b ^ 0x55 for b in data[1000:1064])
    shard.write_bytes(bytes(data))
    out = check_ok(run_cli(["train", "--resume", str(run_copy)], workdir))
    damaged = [line for line in out.splitlines() if "damaged" in line]
    assert len(damaged) == 1
    assert "__0_0.distcp does not match its checksum" in damaged[0]
    assert damaged[0].endswith("using step_000003, the newest intact one")
    assert f"resuming {run_copy} from step 3 of 6" in out
    assert curve(run_copy) == curve(trained)


def test_export_of_a_run_skips_a_damaged_newest_checkpoint(capsys, run_copy: Path) -> None:
    meta = run_copy / "checkpoints" / "step_000006" / "meta.json"
    meta.write_text(meta.read_text().replace('"step": 6', '"step": 7'))
    out = run_copy / "weights.safetensors"
    assert main(["export", str(run_copy), str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("skipping a damaged checkpoint: ") and "meta.json" in lines[0]
    assert lines[1] == f"wrote {out}: the weights of {run_copy / 'checkpoints' / 'step_000003'}"


def test_when_every_checkpoint_is_damaged_resume_says_so_in_one_line(capsys, run_copy: Path) -> None:
    for step in ("step_000003", "step_000006"):
        meta = run_copy / "checkpoints" / step / ".metadata"
        meta.write_bytes(meta.read_bytes()[:-10])
    err = resume_error(capsys, run_copy)
    assert "every complete checkpoint of" in err and "is damaged" in err and ".metadata has" in err


def test_a_crafted_checkpoint_stops_resume_and_export_without_running_its_payload(
    capsys, run_copy: Path, tmp_path: Path
) -> None:
    # Not "damaged": the manifest matches, as a forger would make it. No fallback past it either.
    folder, marker = run_copy / "checkpoints" / "step_000006", tmp_path / "payload-ran"
    body = pickle.dumps(pickle.loads((folder / ".metadata").read_bytes()), protocol=2)
    path = str(marker).encode()
    call = b"cbuiltins\nopen\n(X" + struct.pack("<I", len(path)) + path + b"X\x01\x00\x00\x00wtR0"
    (folder / ".metadata").write_bytes(body[:2] + call + body[2:])
    write_manifest(folder, skip=(".complete",))
    assert "refers to builtins.open" in resume_error(capsys, run_copy)
    assert main(["export", str(run_copy), str(tmp_path / "w.safetensors")]) == 2
    assert "refers to builtins.open" in capsys.readouterr().err
    assert not marker.exists()


@pytest.mark.parametrize(
    ("key", "value", "listed"),
    [
        ("decoder.num_layers", 1, "decoder.num_layers (2 -> 1)"),
        ("decoder.block.attention.num_heads", 8, "decoder.block.attention.num_heads (4 -> 8)"),
        ("dim_model", 64, "dim_model (128 -> 64)"),
    ],
)
def test_a_changed_model_is_refused_with_the_differing_keys(capsys, run_copy, key, value, listed) -> None:
    edit_config(run_copy, key, value)
    err = resume_error(capsys, run_copy)
    assert "--resume: the model in config.yaml differs from the one step_000006 holds" in err
    assert listed in err


def test_changed_training_settings_are_reported(capsys, run_copy: Path) -> None:
    edit_config(run_copy, "train.lr", 0.001)
    edit_config(run_copy, "dropout", 0.1)
    assert main(["train", "--resume", str(run_copy)]) == 0
    out = capsys.readouterr().out
    assert "train.lr changed since step_000006 was saved: 0.003 -> 0.001" in out
    assert "dropout changed since step_000006 was saved: 0.0 -> 0.1" in out


def test_a_second_resume_of_a_folder_in_use_is_refused_naming_the_holder(capsys, run_copy: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
                import sys, time
                from brickwork.train.run_lock import RunLock
                with RunLock({str(run_copy)!r}):
                    print("locked", flush=True)
                    time.sleep(120)
            """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        err = resume_error(capsys, run_copy)
        assert f"is in use by another training process (pid {holder.pid})" in err
    finally:
        holder.kill()
        holder.wait(timeout=30)
    before = (run_copy / "metrics.jsonl").read_text()
    assert main(["train", "--resume", str(run_copy)]) == 0  # the lock died with its holder
    assert (run_copy / "metrics.jsonl").read_text() == before
