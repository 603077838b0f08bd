"""Files the command cannot make, read or finish end in one line naming the file and why, never a
traceback: a run folder under a file or on a read-only disk, hostile HF folders (their payload never
runs), an export onto a full disk (the earlier file stays as it was). A process with a stray RANK still
says its error, and written weights follow the umask."""

from __future__ import annotations

import os
import re
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from small_checkpoint import save_small_checkpoint

from brickwork.checkpoint import export
from brickwork.cli import main
from brickwork.factory import build_model, save_pretrained

HF_CONFIG = (
    '{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 256, '
    '"n_positions": 64, "n_embd": 32, "n_layer": 1, "n_head": 2}'
)


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_a_run_folder_under_a_file_is_named(capsys, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("notes").write_text("a file, not a folder")
    err = error_line(capsys, ["train", "train.steps=1", "train.out_dir=notes/run"])
    assert err == "brickwork train: error: 'notes/run': Not a directory ('notes' is a file, not a folder)"


def test_a_run_folder_on_a_read_only_disk_is_named(tmp_path: Path) -> None:
    # Root writes through permission bits, so as root the folder is a read-only bind mount instead.
    folder = tmp_path / "shared"
    folder.mkdir()
    command = [sys.executable, "-m", "brickwork", "train", "train.steps=1", f"train.out_dir={folder}/run"]
    if os.geteuid() == 0:
        if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "true"]).returncode:
            pytest.skip("running as root without a mount namespace to make a read-only folder in")
        mount = f'mount --bind -o ro {folder} {folder} && exec "$@"'
        command = ["unshare", "-m", "sh", "-c", mount, "sh", *command]
    else:
        folder.chmod(0o555)
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() in (
        f"brickwork train: error: '{folder}/run': Read-only file system",
        f"brickwork train: error: '{folder}/run': Permission denied",
    )
    assert not (folder / "run").exists()


class _TouchesAFile:
    """Pickles as a call of os.system that would create a file, were it loaded unrestricted."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "model.safetensors"])
def test_a_hostile_hf_folder_is_one_line_naming_its_file_and_runs_nothing(
    capsys, tmp_path: Path, weights: str
) -> None:
    folder, marker = tmp_path / "hf", tmp_path / "payload-ran"
    folder.mkdir()
    (folder / "config.json").write_text(HF_CONFIG)
    if weights == "pytorch_model.bin":
        torch.save({"transformer.wte.weight": _TouchesAFile(marker)}, folder / weights)
        reason = f"is not a readable PyTorch weights file: it names {os.system.__module__}.system"
    else:  # a header length field that claims 2**62 bytes
        (folder / weights).write_bytes(struct.pack("<Q", 2**62) + b"{}")
        reason = "is not a readable safetensors file: .*header too large"
    named = re.escape(f"'{folder / weights}' ") + reason
    sample = error_line(capsys, ["sample", str(folder), "--prompt", "x"])
    assert sample.startswith("brickwork sample: error: RUN_OR_FOLDER: ")
    run = error_line(capsys, ["train", "--init-from", str(folder), f"train.out_dir={tmp_path / 'run'}"])
    assert run.startswith(f"brickwork train: error: --init-from: cannot start from '{folder}': ")
    for err in (sample, run):
        assert re.search(named, err), err
        assert "weights_only" not in err
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_an_export_onto_a_full_disk_is_named_and_keeps_the_earlier_file(tmp_path: Path) -> None:
    checkpoint = save_small_checkpoint(tmp_path / "step_000001")
    out = tmp_path / "exports" / "model.safetensors"
    out.parent.mkdir()
    out.write_bytes(b"the earlier export")
    limit = 1024  # bytes a file may grow to; the export's weights take about 2.7 KB

    def file_size_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    result = subprocess.run(
        [sys.executable, "-m", "brickwork", "export", str(checkpoint), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=file_size_limit,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"brickwork export: error: '{out}': could not be written: the file size limit was reached "
        "(File too large); any file there before is unchanged"
    )
    assert out.read_bytes() == b"the earlier export"
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.safetensors"]  # no partial left


def test_a_stray_rank_still_says_its_error_once(capsys, tmp_path: Path, monkeypatch) -> None:
    if dist.is_initialized():  # a group an earlier in-process run left up would stand in for a launcher
        dist.destroy_process_group()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "1")  # no torchrun: no WORLD_SIZE, no rank 0 to speak for it
    for name in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    err = error_line(capsys, ["train", "train.steps=1"])
    assert err == (
        "brickwork train: error: RANK=1 is set, but WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not: this "
        "process was not started by torchrun (or a launcher that sets them together); unset RANK to run "
        "one process, or launch the run with torchrun"
    )
    # Beside a rank 0 (torchrun's world of 2), rank 1 leaves the same mistake to rank 0.
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "train.stpes=3"]) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["022", "027"])
def test_exported_and_saved_weights_follow_the_umask(tmp_path: Path, umask: int) -> None:
    checkpoint = save_small_checkpoint(tmp_path / "step_000001")
    model = build_model("gpt-tiny", {"decoder.num_layers": 1, "dim_model": 32})
    previous = os.umask(umask)
    try:
        export(checkpoint, tmp_path / "model.safetensors")
        save_pretrained(model, tmp_path / "saved")
    finally:
        os.umask(previous)
    for written in (tmp_path / "model.safetensors", tmp_path / "saved" / "model.safetensors"):
        assert oct(written.stat().st_mode & 0o777) == oct(0o666 & ~umask), written
