"""A trained decoder LM to sample from, with its tokenizer and the window it was trained on, and
``brickwork sample`` on it.

``load_trained`` takes anything ``from_pretrained`` reads, through the same reader: a run folder (its
newest intact checkpoint), one checkpoint folder of a run, the safetensors file ``brickwork export``
writes, a ``save_pretrained`` folder or an HF model folder. Nothing pickled is run: checkpoints load
through the safe DCP reader, an HF ``pytorch_model.bin`` with ``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from brickwork.blocks import MODELS
from brickwork.data.tokenizer import ByteTokenizer, HFTokenizer, TokenIds, Tokenizer, load_tokenizer
from brickwork.errors import ConfigError
from brickwork.factory import load_spec
from brickwork.factory.pretrained import read_pretrained
from brickwork.sampling import check_options, check_window, sample_ids

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
    try:
        model, saved = read_pretrained(source, OPTION)
    except (FileNotFoundError, ValueError) as err:
        if isinstance(err, ConfigError) and err.path == OPTION:
            raise
        raise ConfigError(str(err), OPTION) from None
    kind = model.spec["model"]  # a built model's kind is one of MODELS
    if MODELS[kind].task != "causal_lm":
        raise ConfigError(f"{path!r} holds a model of kind {kind!r}; only decoder LMs generate text", OPTION)
    # A checkpoint's run keeps its tokenizer and window; a saved or HF folder may keep a tokenizer.json.
    checkpoint, step = (saved.checkpoint, saved.step) if saved else (None, None)
    folder = checkpoint.parent.parent if checkpoint else source if source.is_dir() else None
    run = load_spec(folder / "config.yaml") if folder and (folder / "config.yaml").is_file() else {}
    window = (run.get("train") or {}).get("seq_len") or model.spec.get("max_seq_len")
    chosen = load_tokenizer(tokenizer, "--tokenizer") if tokenizer else _kept_tokenizer(folder, model)
    if chosen.vocab_size > model.vocab_size:
        raise ConfigError(
            f"the tokenizer has {chosen.vocab_size:,} ids, more than the model's vocab_size "
            f"{model.vocab_size:,}",
            "--tokenizer",
        )
    what = str(source) if step is None else f"{source} at step {step}"
    return Trained(model.to(device).eval(), chosen, window, what)


def _kept_tokenizer(folder: Path | None, model: nn.Module) -> Tokenizer:
    """The tokenizer.json ``folder`` keeps; else bytes for a 256-id model, token ids for any other."""
    if folder is not None and (folder / TOKENIZER_FILE).is_file():
        return HFTokenizer.from_file(folder / TOKENIZER_FILE, OPTION)
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

    Options are checked before anything loads (a ``--window`` past the model's positions as soon as
    its spec is read), each error naming the command's option; what was loaded is logged. ``window``
    defaults to the run's ``train.seq_len``, else the spec's ``max_seq_len``.
    """
    with _named_as_options():
        check_options(max_new_tokens, temperature, top_k, seed, window)
    trained = load_trained(source, tokenizer, "cuda" if torch.cuda.is_available() else "cpu")
    window = window or trained.window
    if window is None:
        raise ConfigError("the model says no training length (no run, no max_seq_len); give one", "--window")
    with _named_as_options():
        check_window(trained.model, window)
    ids = trained.tokenizer.encode(prompt)
    if ids.numel() == 0:
        raise ConfigError("encodes to no tokens; give some text", "--prompt")
    params = sum(p.numel() for p in trained.model.parameters())
    logger.info(f"{trained.description}: {params:,} parameters, tokenizer {trained.tokenizer.name}")
    out = sample_ids(
        trained.model, ids, max_new_tokens, window=window, temperature=temperature, top_k=top_k, seed=seed
    )
    return trained.tokenizer.decode(out)


@contextlib.contextmanager
def _named_as_options() -> Iterator[None]:
    """A ConfigError about a keyword of ``sample_ids`` (``top_k``) as one about its option (``--top-k``)."""
    try:
        yield
    except ConfigError as err:
        raise err.at("", {err.path: f"--{err.path.replace('_', '-')}"}) from None
