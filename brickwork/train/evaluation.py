"""``brickwork eval``: the validation loss of a saved model, on its run's data or another, writing nothing.

The validation set is the one training evaluates on (:func:`validation_batches`): ``train.eval_batches``
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

from brickwork.blocks import MODELS
from brickwork.data import fixed_windows
from brickwork.data.packing import packed_rows
from brickwork.data.sources import TextData, open_text_data
from brickwork.data.task_batches import image_batches, text_batches
from brickwork.errors import ConfigError
from brickwork.train.packing import check_packing
from brickwork.train.preflight import check_device
from brickwork.train.run_config import RunConfig, parse_overrides, resolve_run
from brickwork.train.run_data import run_tokenizer
from brickwork.train.step import evaluate
from brickwork.train.trained_model import OPTION, load_trained

logger = logging.getLogger(__name__)
# What an evaluation may be told: the data, and how much of it to read on which device.
EVAL_TRAIN_KEYS = ("seq_len", "batch_size", "eval_batches", "device", "seed")
# Tasks whose loss is a mean negative log-likelihood per token, so that its exponential is a perplexity.
PERPLEXITY_TASKS = ("causal_lm", "masked_lm")


@dataclass
class Evaluation:
    """What ``brickwork eval`` reports: ``perplexity`` is None for tasks other than language modelling."""

    source: str
    task: str
    val_loss: float
    perplexity: float | None
    batches: int
    data: str


def validation_batches(run: RunConfig, task: str, text: TextData | None) -> list[dict[str, torch.Tensor]]:
    """The fixed validation set of ``run`` for ``task``, from ``text``'s held-out tokens (generated
    images for ``image_classification``), the same in every run with the same settings."""
    cfg = run.train
    if task == "image_classification":
        spec = run.spec
        images = image_batches(spec["image_size"], spec.get("channels", 3), spec["num_classes"],
                               cfg.batch_size, cfg.seed)  # fmt: skip
        return images.validation(cfg.eval_batches)
    if task == "causal_lm":
        inputs, _ = fixed_windows(text.val, cfg.eval_batches * cfg.batch_size, cfg.seq_len)
        if text.end_id is not None:
            return [packed_rows(x, text.end_id) for x in inputs.split(cfg.batch_size)]
        return [{"input_ids": x, "labels": x} for x in inputs.split(cfg.batch_size)]  # HF's: shifted inside
    held_out = text_batches(task, text.val, cfg.batch_size, cfg.seq_len, cfg.seed, text.tokenizer.vocab_size)
    return held_out.validation(cfg.eval_batches)


def evaluate_saved(source: str, overrides: list[str]) -> Evaluation:
    """The validation loss (and perplexity) of the model saved at ``source`` (anything
    ``from_pretrained`` reads) on its run's data, or on the data ``data.*`` ``overrides`` give."""
    for key in parse_overrides(overrides):
        head, _, rest = key.partition(".")
        if head != "data" and not (head == "train" and rest in EVAL_TRAIN_KEYS):
            allowed = ", ".join(f"train.{k}" for k in EVAL_TRAIN_KEYS)
            raise ConfigError(f"eval reads the model as saved; it takes data.* and {allowed}", key)
    trained = load_trained(source, device="cpu", task=None)
    model = trained.model
    base = str(trained.run_config) if trained.run_config else (Path(source).name, model.spec)
    run = resolve_run(base, overrides)
    check_device(run.train.device)
    task = MODELS[model.spec["model"]].task
    text = None
    if task != "image_classification":
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
    batches = validation_batches(run, task, text)
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(auto if run.train.device == "auto" else run.train.device)
    loss = evaluate(model, batches, task)
    if not math.isfinite(loss):
        raise ConfigError(f"the validation loss is {loss}: the weights are damaged", OPTION)
    perplexity = math.exp(loss) if task in PERPLEXITY_TASKS else None
    data = text.description if text is not None else "generated images"
    logger.info(f"{trained.description}: task {task}, {len(batches)} validation batches of {data}")
    return Evaluation(trained.description, task, loss, perplexity, len(batches), data)
