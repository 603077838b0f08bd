"""A trained decoder LM to sample from, with its tokenizer and the window it was trained on, and
``brickwork sample`` on it.

``load_trained`` takes a run folder (its newest intact checkpoint), one checkpoint folder of a run, or
the safetensors file ``brickwork export`` writes. Weights load through the checkpoint code
(torch.distributed.checkpoint with the safe reader) or safetensors: nothing pickled is executed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from brickwork.blocks import MODELS
from brickwork.checkpoint import is_complete, latest_checkpoint, read_checkpoint_weights, read_export
from brickwork.data.tokenizer import ByteTokenizer, HFTokenizer, TokenIds, Tokenizer, load_tokenizer
from brickwork.errors import ConfigError
from brickwork.factory import build_model, load_spec, parse_spec
from brickwork.sampling import sample_ids

OPTION = "RUN_OR_FOLDER"
TOKENIZER_FILE = "tokenizer.json"  # a run keeps a copy of any tokenizer other than bytes
logger = logging.getLogger(__name__)


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
    weights, meta = read_checkpoint_weights(folder)
    return _decoder(meta.get("spec"), weights, folder)


def _from_export(file: Path) -> tuple[nn.Module, Path | None, str]:
    text, weights, metadata = read_export(file)
    model = _decoder(parse_spec(text, "json", source=f"{file} metadata"), weights, file)
    return model, None, f"{file} (step {metadata.get('step', '?')})"


def _decoder(spec: dict[str, Any] | None, weights: dict[str, torch.Tensor], source: Path) -> nn.Module:
    """The decoder LM ``spec`` describes, holding ``weights``; ConfigError for any other kind."""
    if not spec or spec.get("model") not in MODELS or MODELS[spec["model"]].task != "causal_lm":
        kind = (spec or {}).get("model")
        raise ConfigError(f"{str(source)!r} holds a {kind} model; only decoder LMs generate text", OPTION)
    model = build_model(spec)
    model.load_state_dict(weights, strict=True)
    return model


def _kept_tokenizer(run_dir: Path | None, model: nn.Module) -> Tokenizer:
    """The run's tokenizer.json; else bytes for a 256-id model, token ids for any other."""
    if run_dir is not None and (run_dir / TOKENIZER_FILE).is_file():
        return HFTokenizer.from_file(run_dir / TOKENIZER_FILE, OPTION)
    if model.vocab_size == ByteTokenizer.vocab_size:
        return ByteTokenizer()
    return TokenIds(model.vocab_size)


def sample_text(
    source: str,
    prompt: str,
    *,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 0,
    window: int | None = None,
    tokenizer: str | None = None,
) -> str:
    """``brickwork sample``: ``prompt`` and its continuation by the model saved at ``source``.

    Options are checked before anything loads; what was loaded is logged. ``window`` defaults to the
    run's ``train.seq_len``, else the spec's ``max_seq_len``.
    """
    limits = (("max-new-tokens", max_new_tokens, 0), ("top-k", top_k, 1), ("window", window, 1))
    for option, value, least in limits:
        if value is not None and value < least:
            raise ConfigError(f"must be an integer >= {least}, got {value}", f"--{option}")
    if temperature < 0:
        raise ConfigError(f"must be >= 0, got {temperature}", "--temperature")
    trained = load_trained(source, tokenizer, "cuda" if torch.cuda.is_available() else "cpu")
    window = window or trained.window
    if window is None:
        raise ConfigError("the model says no training length (no run, no max_seq_len); give one", "--window")
    ids = trained.tokenizer.encode(prompt)
    if ids.numel() == 0:
        raise ConfigError("encodes to no tokens; give some text", "--prompt")
    params = sum(p.numel() for p in trained.model.parameters())
    logger.info(f"{trained.description}: {params:,} parameters, tokenizer {trained.tokenizer.name}")
    out = sample_ids(
        trained.model, ids, max_new_tokens, window=window, temperature=temperature, top_k=top_k, seed=seed
    )
    return trained.tokenizer.decode(out)
