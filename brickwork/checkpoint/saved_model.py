"""A saved model on disk: the ``save_pretrained`` folder, and finding a model's spec and weights in any
of the forms ``from_pretrained`` reads.

The folder holds ``spec.yaml`` (the resolved spec) and ``model.safetensors`` (each weight once: a tied
head is stored under the embedding's name only; a vocabulary the model pads, by its real rows only),
and for a model with a head HF has, HF's ``config.json`` (hf_folder.py). Each file is written beside
its final name and renamed into place, the old spec and config removed first and the new ones renamed
last, so the folder never holds a half-written file, nor, after an overwrite cut short, one save's
spec beside another's weights. The other forms are a ``brickwork train`` run folder (its newest
intact, complete checkpoint), one checkpoint folder, the single file ``brickwork export`` writes, and
the folder a ``brickwork.hf`` class saves (``config.json`` with the spec, the weights under ``model.``).
What is read here is the spec as stored and the weights; the factory builds the model from them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from brickwork.checkpoint.export import read_checkpoint_weights, read_export, read_weights
from brickwork.checkpoint.folder import is_complete
from brickwork.checkpoint.hf_folder import (
    CONFIG_FILE,
    MODEL_TYPE,
    WEIGHTS_FILE,
    read_brickwork_folder,
    read_config,
)
from brickwork.checkpoint.run_folder import latest_checkpoint
from brickwork.checkpoint.safe_write import partial_path, write_partial, writing
from brickwork.layout.vocab_padding import unpadded_state_dict

SPEC_FILE = "spec.yaml"


def write_saved_model(
    folder: Path,
    write_spec: Callable[[Path], Any],
    weights: dict[str, torch.Tensor],
    config: Mapping[str, Any] | None = None,
) -> Path:
    """Write a saved-model folder: ``write_spec(path)`` writes the spec file, ``weights`` are the
    tensors (see :func:`unique_weights`), ``config`` HF's ``config.json`` (none when None). The folder
    is created if needed; returns it. The files get the mode the umask gives; a write that fails (a
    full disk) leaves the folder's earlier save as it was and raises an OSError naming the file and the
    cause."""
    folder.mkdir(parents=True, exist_ok=True)
    writers = {SPEC_FILE: write_spec}
    if config is not None:
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        writers[CONFIG_FILE] = lambda path: path.write_text(text, encoding="utf-8")
    partials: dict[str, Path] = {}
    try:
        for name, write in writers.items():
            partials[name] = partial_path(folder / name)
            with writing(folder / name, partials[name]):
                write(partials[name])
        weights_partial = write_partial(weights, folder / WEIGHTS_FILE, {"format": "pt"})
    except OSError:
        for partial in partials.values():
            partial.unlink(missing_ok=True)  # the earlier save stays, with nothing half-made beside it
        raise
    # A save cut short between these renames leaves no spec.yaml (read_saved_model then says so),
    # never a spec (or an HF config, which holds one) beside another save's weights of the same shapes.
    for name in (SPEC_FILE, CONFIG_FILE):
        (folder / name).unlink(missing_ok=True)
    os.replace(weights_partial, folder / WEIGHTS_FILE)
    for name, partial in partials.items():  # the spec first: a folder without it was cut short
        os.replace(partial, folder / name)
    return folder


def unique_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict with each tied Parameter once, under its first name, as contiguous CPU
    tensors; a padded vocabulary's real rows only (``vocab_multiple``: the spec pads them again)."""
    seen: dict[int, str] = {}
    aliases = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            aliases.add(name)
        seen.setdefault(id(param), name)
    return {
        name: value.detach().cpu().contiguous()
        for name, value in unpadded_state_dict(model).items()
        if name not in aliases
    }


@dataclass(frozen=True)
class SavedModel:
    """A model's spec and weights as stored, and where they came from."""

    spec: Mapping[str, Any] | Path | str  # a checkpoint's spec; the spec file; an export's JSON text
    weights: dict[str, torch.Tensor]
    source: Path  # the file or folder the weights were read from, to name in errors
    checkpoint: Path | None = None  # the checkpoint folder read, for a run or checkpoint folder
    step: int | None = None  # the training step of a checkpoint, or of an export file that names one


def read_saved_model(path: str | os.PathLike, option: str = "path") -> SavedModel | None:
    """The spec and weights saved at ``path``: a save_pretrained folder, a run folder, a checkpoint
    folder, an export file or a ``brickwork.hf`` class's folder; None for the ``config.json`` folder of
    a model of HF's own families. FileNotFoundError when none is there; a ConfigError about a run
    folder's checkpoints names ``option``; a damaged file raises an error naming it."""
    source = Path(path)
    if source.is_file():
        text, weights, metadata = read_export(source)
        step = metadata.get("step", "")
        return SavedModel(text, weights, source, step=int(step) if step.isdigit() else None)
    if not source.is_dir():
        raise FileNotFoundError(f"{str(source)!r} does not exist")
    if (source / SPEC_FILE).is_file():
        return SavedModel(source / SPEC_FILE, read_weights(source / WEIGHTS_FILE), source / WEIGHTS_FILE)
    config = read_config(source)
    if config is not None:
        if config.get("model_type") != MODEL_TYPE:
            return None
        return SavedModel(*read_brickwork_folder(source, config), source)
    if not is_complete(source) and not (source / "config.yaml").is_file():
        if partial_path(source / SPEC_FILE).is_file():
            raise FileNotFoundError(
                f"{str(source)!r} holds a save_pretrained that was cut short before its {SPEC_FILE} was "
                "in place (the new files are the .partial ones beside it): save the model again"
            )
        if (source / WEIGHTS_FILE).is_file():
            raise FileNotFoundError(
                f"{str(source)!r} holds {WEIGHTS_FILE} without a spec, as HF's Trainer.save_model saves "
                "a plain brickwork model: load it into the model (model.load_state_dict("
                "safetensors.torch.load_file(...))), or train brickwork.hf's class of the model, whose "
                "folders carry the spec"
            )
        raise FileNotFoundError(
            f"{str(source)!r} is none of the folders from_pretrained reads: a save_pretrained folder "
            f"({SPEC_FILE} and {WEIGHTS_FILE}), a brickwork train run folder (config.yaml and "
            "checkpoints/), a checkpoint folder (.complete), or an HF model folder (config.json)"
        )
    folder = source if is_complete(source) else latest_checkpoint(source, option, intact=True)[1]
    # latest_checkpoint has just checked the run's checkpoint against its manifest: not read twice.
    weights, meta = read_checkpoint_weights(folder, verify=folder == source)
    if not isinstance(meta.get("spec"), Mapping):
        raise ValueError(f"checkpoint {str(folder)!r} records no model spec: it cannot be rebuilt alone")
    return SavedModel(meta["spec"], weights, folder, folder, meta["step"])
