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
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from brickwork.data.sources import TextData, open_text_data
from brickwork.data.tokenizer import ByteTokenizer, HFTokenizer, TokenIds, Tokenizer, load_tokenizer
from brickwork.errors import ConfigError
from brickwork.factory import load_spec
from brickwork.factory.pretrained import read_pretrained
from brickwork.sampling import check_options, check_window, sample_ids
from brickwork.train.run_config import resolve_run
from brickwork.train.tasks import kind_task

OPTION = "RUN_OR_FOLDER"
TOKENIZER_FILE = "tokenizer.json"  # a run keeps a copy of any tokenizer other than bytes
logger = logging.getLogger(__name__)


@dataclass
class Trained:
    """A single-process model in eval mode; ``window``: the most tokens it reads at once (None when
    neither the run nor the spec says); ``run_config``: the config.yaml of the run it comes from."""

    model: nn.Module
    tokenizer: Tokenizer
    window: int | None
    description: str
    run_config: Path | None = None


def load_trained(
    path: str, tokenizer: str | None = None, device: str = "cpu", generating: bool = True
) -> Trained:
    """The model saved at ``path``; ``tokenizer`` (``bytes`` or a tokenizer.json) replaces the one the
    run kept. While ``generating``, a model whose kind's task generates no text is refused."""
    source = Path(path).expanduser()
    try:
        model, saved = read_pretrained(source, OPTION)
    except (FileNotFoundError, ValueError) as err:
        if isinstance(err, ConfigError) and err.path == OPTION:
            raise
        raise ConfigError(str(err), OPTION) from None
    kind = model.spec["model"]  # a built model's kind is one of MODELS
    if generating and not kind_task(kind).samples_text:
        raise ConfigError(f"{path!r} holds a model of kind {kind!r}; only decoder LMs generate text", OPTION)
    # A checkpoint's run keeps its tokenizer and window; a saved or HF folder may keep a tokenizer.json.
    checkpoint, step = (saved.checkpoint, saved.step) if saved else (None, None)
    folder = checkpoint.parent.parent if checkpoint else source if source.is_dir() else None
    config = folder / "config.yaml" if folder and (folder / "config.yaml").is_file() else None
    run = load_spec(config) if config else {}
    window = (run.get("train") or {}).get("seq_len") or model.spec.get("max_seq_len")
    chosen = load_tokenizer(tokenizer, "--tokenizer") if tokenizer else _kept_tokenizer(folder, model)
    if getattr(model, "vocab_size", None) is not None and chosen.vocab_size > model.vocab_size:
        raise ConfigError(
            f"the tokenizer has {chosen.vocab_size:,} ids, more than the model's vocab_size "
            f"{model.vocab_size:,}",
            "--tokenizer",
        )
    what = str(source) if step is None else f"{source} at step {step}"
    return Trained(model.to(device).eval(), chosen, window, what, config)


def held_out_prompt(val: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The default prompt of a run's samples: the first quarter window of its held-out tokens."""
    return val[: max(1, seq_len // 4)].long()


def encode_prompt(tokenizer: Tokenizer, prompt: str, option: str = "--prompt") -> torch.Tensor:
    """``prompt``'s ids; ConfigError naming ``option`` and the first character the tokenizer cannot
    encode (or why, where no single character is to blame), or saying it encodes to nothing."""
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as err:
        for index, char in enumerate(prompt):
            try:
                tokenizer.encode(char)
            except ValueError:
                raise ConfigError(
                    f"{char!r} (character {index + 1}) is not in the vocabulary of {tokenizer.name}", option
                ) from None
        raise ConfigError(str(err), option) from None
    if ids.numel() == 0:
        raise ConfigError("encodes to no tokens; give some text", option)
    return ids


def _kept_tokenizer(folder: Path | None, model: nn.Module) -> Tokenizer:
    """The tokenizer.json ``folder`` keeps; else bytes for a 256-id model, token ids for any other."""
    if folder is not None and (folder / TOKENIZER_FILE).is_file():
        return HFTokenizer.from_file(folder / TOKENIZER_FILE, OPTION)
    if model.vocab_size == ByteTokenizer.vocab_size:
        return ByteTokenizer()
    return TokenIds(model.vocab_size)


def sample_text(
    source: str,
    prompt: str | None = None,
    *,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 0,
    window: int | None = None,
    tokenizer: str | None = None,
    num_samples: int = 1,
) -> list[str]:
    """``brickwork sample``: ``num_samples`` continuations (seeds ``seed``, ``seed + 1``, ...) of
    ``prompt`` by the model saved at ``source``, each with its prompt.

    Options are checked before anything loads (a ``--window`` past the model's positions as soon as
    its spec is read), each error naming the command's option; what was loaded is logged. ``window``
    defaults to the run's ``train.seq_len``, else the spec's ``max_seq_len``. Without ``prompt`` a
    run's model continues the start of the run's held-out data, as its end-of-run sample does; any
    other model continues a newline.
    """
    with _named_as_options():
        check_options(max_new_tokens, temperature, top_k, seed, window)
    if num_samples < 1:
        raise ConfigError(f"must be >= 1, got {num_samples}", "--num-samples")
    trained = load_trained(source, tokenizer, "cuda" if torch.cuda.is_available() else "cpu")
    window = window or trained.window
    if window is None:
        raise ConfigError("the model says no training length (no run, no max_seq_len); give one", "--window")
    with _named_as_options():
        check_window(trained.model, window)
    if prompt is None and trained.run_config is not None:
        try:
            ids = held_out_prompt(run_held_out(trained.run_config, trained.tokenizer).val, window)
        except ConfigError as err:
            raise ConfigError(
                f"the default prompt, the run's held-out data, cannot be read ({err.path}: {err.reason}); "
                "give a prompt",
                "--prompt",
            ) from None
    else:
        ids = encode_prompt(trained.tokenizer, "\n" if prompt is None else prompt)
    params = sum(p.numel() for p in trained.model.parameters())
    logger.info(f"{trained.description}: {params:,} parameters, tokenizer {trained.tokenizer.name}")
    return [
        trained.tokenizer.decode(
            sample_ids(
                trained.model,
                ids,
                max_new_tokens,
                window=window,
                temperature=temperature,
                top_k=top_k,
                seed=seed + index,
            )
        )
        for index in range(num_samples)
    ]


def run_held_out(config: Path, tokenizer: Tokenizer) -> TextData:
    """The data of the run ``config`` describes, read with ``tokenizer`` into a scratch token cache, so
    the run folder is left as it was."""
    run = resolve_run(str(config), [])
    with tempfile.TemporaryDirectory(prefix="brickwork-data-") as cache:
        return open_text_data(run.data, tokenizer, Path(cache), run.train.seq_len)


@contextlib.contextmanager
def _named_as_options() -> Iterator[None]:
    """A ConfigError about a keyword of ``sample_ids`` (``top_k``) as one about its option (``--top-k``)."""
    try:
        yield
    except ConfigError as err:
        raise err.at("", {err.path: f"--{err.path.replace('_', '-')}"}) from None
