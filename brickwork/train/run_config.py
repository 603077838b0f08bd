"""A run config: a model spec plus ``train:``, ``data:`` and ``dist:`` sections, from a preset or a file.

``brickwork train [SPEC] [key=value ...]`` resolves into one of these, and from it into the run
(brickwork/train/run.py). Its ``to_dict()`` is what the run folder's ``config.yaml`` holds, and that
file is itself a valid SPEC, so ``brickwork train RUN/config.yaml`` repeats the run. The model spec's
``vocab_size`` follows the data's tokenizer (:func:`task_spec`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brickwork.blocks import MODELS
from brickwork.data.config import DataConfig
from brickwork.data.sources import declared_tokenizer
from brickwork.data.tokenizer import Tokenizer
from brickwork.errors import ConfigError
from brickwork.factory import apply_overrides, get_preset, list_presets, load_spec
from brickwork.factory.overrides import parse_override, set_dotted, with_overrides
from brickwork.launch_env import is_first_rank
from brickwork.option_types import config_to_dict, to_config
from brickwork.train.config import TrainConfig
from brickwork.train.dropout_override import KEY as DROPOUT_KEY
from brickwork.train.dropout_override import say_spread, spread_dropout
from brickwork.train.tasks import TextTask, kind_task

logger = logging.getLogger(__name__)
DEFAULT_PRESET = "gpt-tiny"
SECTIONS = ("train", "data", "dist")
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
# train: keys whose None means "derived from other keys"; config.yaml keeps the None when the user
# gave none, so that a run repeated with another train.steps or seq_len derives them afresh.
DERIVED_TRAIN_KEYS = ("warmup_steps", "sample_tokens")


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs. ``spec`` is the model spec; ``name`` labels the run folder and plot."""

    name: str
    spec: dict[str, Any]
    train: TrainConfig
    data: DataConfig
    dist: dict[str, Any]
    derived: tuple[str, ...] = ()  # the DERIVED_TRAIN_KEYS the user left unset
    # Whether the user chose vocab_size (an override or their spec file) rather than a preset: a
    # preset's follows the tokenizer, a chosen one is never lowered and may not be too small.
    vocab_chosen: bool = True

    def to_dict(self) -> dict[str, Any]:
        train = config_to_dict(self.train)
        train.update({key: None for key in self.derived})
        return {
            **copy.deepcopy(self.spec),
            "train": train,
            "data": config_to_dict(self.data),
            "dist": copy.deepcopy(self.dist),
        }


def load_base(spec_arg: str | tuple[str, dict[str, Any]] | None) -> tuple[str, dict[str, Any]]:
    """(run name, spec dict) for a preset name or a .yaml/.yml/.json path; None means the default preset,
    and a (name, spec) pair is taken as it is (a saved model's, for ``--init-from``)."""
    if spec_arg is None:
        return DEFAULT_PRESET, get_preset(DEFAULT_PRESET)
    if isinstance(spec_arg, tuple):
        return spec_arg[0], copy.deepcopy(spec_arg[1])
    path = Path(spec_arg)
    if path.suffix.lower() in SPEC_SUFFIXES or path.exists():
        if not path.is_file():
            raise ConfigError(f"spec file {spec_arg!r} does not exist", "SPEC")
        name = path.parent.name if path.stem == "config" and path.parent.name else path.stem
        return name, load_spec(path)
    if spec_arg not in list_presets():
        raise ConfigError(
            f"{spec_arg!r} is neither a preset nor a .yaml/.json file",
            "SPEC",
            choices=list_presets(),
            got=spec_arg,
        )
    return spec_arg, get_preset(spec_arg)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["train.lr=1e-3", ...]`` -> ``{"train.lr": 0.001, ...}`` with values read as YAML."""
    parsed = {}
    for text in overrides:
        parts, value = parse_override(text)
        parsed[".".join(parts)] = value
    return parsed


def resolve_run(spec_arg: str | tuple[str, dict[str, Any]] | None, overrides: list[str]) -> RunConfig:
    """Read SPEC, apply the overrides to the model spec and the sections, and check every part.

    The model spec is validated by the factory here; it is fully resolved (defaults filled) only when
    the model is built, or here when a top-level ``dropout=`` override must reach every dropout
    (brickwork/train/dropout_override.py).
    """
    name, base = load_base(spec_arg)
    sections = {key: copy.deepcopy(base.get(key)) or {} for key in SECTIONS}
    model_spec = {k: v for k, v in base.items() if k not in SECTIONS}
    model_overrides = {}
    for key, value in parse_overrides(overrides).items():
        head = key.split(".")[0]
        if head in SECTIONS:
            set_dotted(sections, key.split("."), value)
        else:
            model_overrides[key] = value
    data = to_config(DataConfig, sections["data"], "data")
    model_spec = with_overrides(model_spec, model_overrides)
    if "vocab_size" not in model_spec and MODELS.get(model_spec.get("model")) is not None:
        model_spec = _vocab_from_data(model_spec, data)
    model_spec = apply_overrides(model_spec, {})
    if DROPOUT_KEY in model_overrides:
        model_spec, places = spread_dropout(model_spec, model_overrides[DROPOUT_KEY])
        say_spread(model_overrides[DROPOUT_KEY], places)
    dist = sections["dist"]
    if dist == "auto":  # the planner picks the layout at launch (brickwork/train/auto_dist.py)
        dist = {"auto": True}
    if not isinstance(dist, Mapping):
        raise ConfigError(f"must be a mapping of parallel options, got {dist!r}", "dist")
    preset = spec_arg is None or (spec_arg in list_presets() and not Path(spec_arg).exists())
    return RunConfig(
        name=name,
        spec=model_spec,
        train=to_config(TrainConfig, sections["train"], "train"),
        data=data,
        dist=dict(dist),
        derived=tuple(k for k in DERIVED_TRAIN_KEYS if sections["train"].get(k) is None),
        vocab_chosen=(not preset and "vocab_size" in base) or "vocab_size" in model_overrides,
    )


def _vocab_from_data(spec: dict[str, Any], data: DataConfig) -> dict[str, Any]:
    """``spec`` with the ``vocab_size`` it leaves out taken from the data's tokenizer (``data.tokenizer``,
    a data folder's tokenizer.json or nanoGPT meta.pkl, else bytes), saying where it came from. A
    model that reads images has no vocabulary to fill."""
    task = kind_task(spec["model"])
    if not task.uses_tokenizer:
        return spec
    tokenizer = declared_tokenizer(data.path, data.tokenizer, None)
    size = task.vocab_size(tokenizer.vocab_size)
    if is_first_rank():
        logger.info(f"vocab_size {size}: left out of the spec, so the tokenizer {tokenizer.name} sets it")
    return {**spec, "vocab_size": size}


def task_spec(run: RunConfig, task: TextTask, tokenizer: Tokenizer | None, quiet: bool = False) -> dict:
    """The model spec a run builds for its data: ``vocab_size`` set to the tokenizer's (plus the mask id
    or the T5 sentinels), saying so if it changes (unless ``quiet``). A vocab_size the user chose is
    kept when larger (padding), and is an error when smaller: the data holds ids it has no row for."""
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
