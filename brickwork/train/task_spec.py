"""The model spec a run builds for its data: ``vocab_size`` set to what the tokenizer needs."""

from __future__ import annotations

import logging

from brickwork.data.tokenizer import Tokenizer
from brickwork.errors import ConfigError
from brickwork.launch_env import is_first_rank
from brickwork.train.run_config import RunConfig
from brickwork.train.tasks import TextTask

logger = logging.getLogger(__name__)


def task_spec(run: RunConfig, task: TextTask, tokenizer: Tokenizer | None, quiet: bool = False) -> dict:
    """The spec with ``vocab_size`` set to the tokenizer's (plus the mask id or the T5 sentinels),
    saying so if it changes (unless ``quiet``). A vocab_size the user chose is kept when larger
    (padding), and is an error when smaller: the data holds ids it has no row for."""
    spec = dict(run.spec)
    if tokenizer is None:
        return spec
    want, vocab = task.vocab_size(tokenizer.vocab_size), spec.get("vocab_size")
    extra = task.extra_ids_note
    if run.vocab_chosen and vocab is not None and vocab > want:
        return spec
    if run.vocab_chosen and vocab is not None and vocab < want:
        raise ConfigError(
            f"{vocab:,} is smaller than the {want:,} ids of the data: the tokenizer {tokenizer.name}{extra}; "
            f"raise it to {want} or leave it out",
            "vocab_size",
        )
    if vocab != want and not quiet and is_first_rank():
        logger.info(f"vocab_size {vocab} -> {want}: the vocabulary of {tokenizer.name}{extra}")
    spec["vocab_size"] = want
    return spec
