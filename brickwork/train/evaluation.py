"""``brickwork eval``: the validation loss of a saved model, on its run's data or another, writing nothing.

The validation set is the one training evaluates on (``Task.validation_batches``): ``train.eval_batches``
batches of ``train.batch_size`` rows from the held-out data. A run folder or checkpoint brings its own
config.yaml; any other model (a save_pretrained or HF folder, an export) takes the defaults of a run,
its kept tokenizer and the embedded corpus, unless ``data.*`` overrides say otherwise.
"""

from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from brickwork.data.sources import open_text_data
from brickwork.errors import ConfigError
from brickwork.train.packing import check_packing
from brickwork.train.preflight import check_device
from brickwork.train.run_config import parse_overrides, resolve_run
from brickwork.train.run_data import run_tokenizer
from brickwork.train.step import evaluate
from brickwork.train.tasks import kind_task
from brickwork.train.trained_model import OPTION, load_trained

logger = logging.getLogger(__name__)
# What an evaluation may be told: the data, and how much of it to read on which device.
EVAL_TRAIN_KEYS = ("seq_len", "batch_size", "eval_batches", "device", "seed")


@dataclass
class Evaluation:
    """What ``brickwork eval`` reports: ``perplexity`` is None for tasks other than language modelling."""

    source: str
    task: str
    val_loss: float
    perplexity: float | None
    batches: int
    data: str


def evaluate_saved(source: str, overrides: list[str]) -> Evaluation:
    """The validation loss (and perplexity) of the model saved at ``source`` (anything
    ``from_pretrained`` reads) on its run's data, or on the data ``data.*`` ``overrides`` give."""
    for key in parse_overrides(overrides):
        head, _, rest = key.partition(".")
        if head != "data" and not (head == "train" and rest in EVAL_TRAIN_KEYS):
            allowed = ", ".join(f"train.{k}" for k in EVAL_TRAIN_KEYS)
            raise ConfigError(f"eval reads the model as saved; it takes data.* and {allowed}", key)
    trained = load_trained(source, device="cpu", generating=False)
    model = trained.model
    base = str(trained.run_config) if trained.run_config else (Path(source).name, model.spec)
    run = resolve_run(base, overrides)
    check_device(run.train.device)
    task = kind_task(model.spec["model"])
    text = None
    if task.uses_tokenizer:
        # A run's own tokenizer, or one data.tokenizer names; a saved folder keeps its own.
        own = trained.run_config is None and run.data.tokenizer is None
        tokenizer = trained.tokenizer if own else run_tokenizer(run)
        if tokenizer.vocab_size > model.vocab_size:
            raise ConfigError(
                f"the tokenizer has {tokenizer.vocab_size:,} ids, more than the model's vocab_size "
                f"{model.vocab_size:,}",
                "data.tokenizer",
            )
        check_packing(run, task, tokenizer, model.spec)
        with tempfile.TemporaryDirectory(prefix="brickwork-eval-") as cache:
            text = open_text_data(run.data, tokenizer, Path(cache), run.train.seq_len)
    batches = task.validation_batches(run, text)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(auto if run.train.device == "auto" else run.train.device)
    loss = evaluate(model, batches, task, precision=run.train.precision)
    if not math.isfinite(loss):
        raise ConfigError(f"the validation loss is {loss}: the weights are damaged", OPTION)
    perplexity = math.exp(loss) if task.perplexity else None
    data = text.description if text is not None else "generated images"
    logger.info(f"{trained.description}: task {task.name}, {len(batches)} validation batches of {data}")
    return Evaluation(trained.description, task.name, loss, perplexity, len(batches), data)
