"""``brickwork train --init-from PATH``: a new run starts from a save_pretrained folder or an HF model
folder; its first validation loss is the saved model's own, recomputed here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from cli_runs import SMALL, check_ok, read_metrics, run_cli

from brickwork.data import ByteTokenizer, fixed_windows, read_corpus, split_tokens
from brickwork.factory import build_model, load_spec, save_pretrained

pytestmark = pytest.mark.slow
SEQ_LEN, WINDOWS = 32, 8  # SMALL's train.seq_len, and train.eval_batches x train.batch_size


def first_val_loss(run_dir: Path) -> float:
    return next(r["val_loss"] for r in read_metrics(run_dir) if r.get("val_loss") is not None)


def held_out_loss(model: torch.nn.Module) -> float:
    """The run's validation loss before any step, written out: next-byte cross-entropy on the same
    held-out windows (HF's shift: position t against byte t + 1)."""
    data, _ = read_corpus(None)
    _, val = split_tokens(ByteTokenizer().encode(data), 0.1, SEQ_LEN)
    x, _ = fixed_windows(val, WINDOWS, SEQ_LEN)
    model.eval()
    with torch.no_grad():
        out = model(x)
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return F.cross_entropy(logits[:, :-1].double().flatten(0, 1), x[:, 1:].flatten()).item()


def test_a_saved_folder_gives_the_spec_and_the_starting_weights(workdir: Path) -> None:
    torch.manual_seed(3)
    model = build_model("gpt-tiny", {"decoder.num_layers": 1, "dim_model": 48})
    save_pretrained(model, workdir / "saved")
    args = ["train", "--init-from", str(workdir / "saved"), *SMALL, "train.out_dir=init-saved"]
    check_ok(run_cli(args, workdir))
    config = load_spec(workdir / "init-saved" / "config.yaml")
    assert config["train"]["init_from"] == str(workdir / "saved")
    assert config["dim_model"] == 48 and config["decoder"]["num_layers"] == 1
    assert first_val_loss(workdir / "init-saved") == pytest.approx(held_out_loss(model), rel=1e-5)


def test_an_hf_model_folder_starts_through_from_hf(workdir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=64, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0
    )
    torch.manual_seed(4)
    hf = transformers.GPT2LMHeadModel(config)
    hf.save_pretrained(workdir / "hf")
    args = ["train", "--init-from", str(workdir / "hf"), *SMALL, "train.out_dir=init-hf"]
    check_ok(run_cli(args, workdir))
    # The HF model itself is the reference.
    assert load_spec(workdir / "init-hf" / "config.yaml")["vocab_size"] == 256
    assert first_val_loss(workdir / "init-hf") == pytest.approx(held_out_loss(hf), rel=1e-5)


def test_init_from_refusals_name_the_option(workdir: Path) -> None:
    missing = run_cli(["train", "--init-from", str(workdir / "nowhere"), *SMALL], workdir)
    assert missing.returncode != 0 and "--init-from" in missing.stderr and "nowhere" in missing.stderr
    torch.manual_seed(0)
    save_pretrained(build_model("gpt-tiny", {"decoder.num_layers": 1}), workdir / "one-layer")
    mismatch = run_cli(["train", "--init-from", str(workdir / "one-layer"), "gpt-tiny", *SMALL], workdir)
    assert mismatch.returncode != 0 and "do not fit this run's model spec" in mismatch.stderr
    both = run_cli(["train", "--resume", str(workdir), "--init-from", str(workdir / "one-layer")], workdir)
    assert both.returncode != 0 and "takes its weights from its own checkpoint" in both.stderr
