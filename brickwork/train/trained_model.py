"""A trained decoder LM to sample from, with its tokenizer and the window it was trained on.

``load_trained`` takes a run folder (its newest intact checkpoint), one checkpoint folder of a run, or
the safetensors file ``brickwork export`` writes. Weights load through the checkpoint code
(torch.distributed.checkpoint with the safe reader) or safetensors: nothing pickled is executed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from brickwork.data.tokenizer import ByteTokenizer, HFTokenizer, TokenIds, Tokenizer, load_tokenizer
from brickwork.errors import ConfigError
from brickwork.factory import build_model, load_spec
from brickwork.parallel import is_complete, load_checkpoint
from brickwork.parallel.checkpoint import META_FILE
from brickwork.train.checkpoint import latest_checkpoint

OPTION = "RUN_OR_FOLDER"
TOKENIZER_FILE = "tokenizer.json"  # a run keeps a copy of any tokenizer other than bytes


@dataclass
class Trained:
    """A single-process model in eval mode; ``window``: the most tokens it reads at once (None when
    neither the run nor the spec says)."""

    model: nn.Module
    tokenizer: Tokenizer
    window: int | None
    description: str


def load_trained(path: str, tokenizer: str | None = None, device: str = "cpu") -> Trained:
    """The model saved at ``path``; ``tokenizer`` (``bytes`` or a tokenizer.json) replaces the one the
    run kept."""
    source = Path(path).expanduser()
    if source.is_file() and source.suffix == ".safetensors":
        model, run_dir, what = _from_export(source)
    elif is_complete(source):
        model, run_dir, what = _from_checkpoint(source), source.parent.parent, f"checkpoint {source}"
    elif (source / "config.yaml").is_file():
        step, folder = latest_checkpoint(source, OPTION, intact=True)
        model, run_dir, what = _from_checkpoint(folder), source, f"run {source} at step {step}"
    else:
        raise ConfigError(
            f"{path!r} is neither a run folder (config.yaml and checkpoints), a complete checkpoint "
            "folder, nor a .safetensors file written by brickwork export",
            OPTION,
        )
    run = load_spec(run_dir / "config.yaml") if run_dir and (run_dir / "config.yaml").is_file() else {}
    window = (run.get("train") or {}).get("seq_len") or model.spec.get("max_seq_len")
    chosen = load_tokenizer(tokenizer, "--tokenizer") if tokenizer else _kept_tokenizer(run_dir, model)
    if chosen.vocab_size > model.vocab_size:
        raise ConfigError(
            f"the tokenizer has {chosen.vocab_size:,} ids, more than the model's vocab_size "
            f"{model.vocab_size:,}",
            "--tokenizer",
        )
    return Trained(model.to(device).eval(), chosen, window, what)


def _from_checkpoint(folder: Path) -> nn.Module:
    meta = json.loads((folder / META_FILE).read_text())
    model = _decoder(meta.get("spec"), folder)
    load_checkpoint(folder, model)
    return model


def _from_export(file: Path) -> tuple[nn.Module, Path | None, str]:
    with safe_open(str(file), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if "spec" not in metadata:
        raise ConfigError(
            f"{str(file)!r} holds no model spec in its metadata (not a brickwork export)", OPTION
        )
    model = _decoder(json.loads(metadata["spec"]), file)
    model.load_state_dict(load_file(str(file)), strict=True)
    return model, None, f"{file} (step {metadata.get('step', '?')})"


def _decoder(spec: dict[str, Any] | None, source: Path) -> nn.Module:
    if not spec or spec.get("model") != "decoder_lm":
        kind = (spec or {}).get("model")
        raise ConfigError(f"{str(source)!r} holds a {kind} model; only decoder LMs generate text", OPTION)
    return build_model(spec)


def _kept_tokenizer(run_dir: Path | None, model: nn.Module) -> Tokenizer:
    """The run's tokenizer.json; else bytes for a 256-id model, token ids for any other."""
    if run_dir is not None and (run_dir / TOKENIZER_FILE).is_file():
        return HFTokenizer.from_file(run_dir / TOKENIZER_FILE, OPTION)
    if model.vocab_size == ByteTokenizer.vocab_size:
        return ByteTokenizer()
    return TokenIds(model.vocab_size)


def describe(trained: Trained) -> str:
    params = sum(p.numel() for p in trained.model.parameters())
    return f"{trained.description}: {params:,} parameters, tokenizer {trained.tokenizer.name}"
