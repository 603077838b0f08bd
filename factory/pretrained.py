"""``save_pretrained`` / ``from_pretrained``: a model's spec and weights in a folder, as HF keeps them.

A saved folder holds ``spec.yaml`` (the resolved spec) and ``model.safetensors`` (each weight once: a
tied head is stored under the embedding's name only, and tied again on load). Nothing is pickled.
``from_pretrained`` also takes a ``brickwork train`` run folder (its newest intact, complete
checkpoint), one checkpoint folder, the single file ``brickwork export`` writes (the spec rides in its
metadata), and an HF model folder (``config.json``, through the HF converter). Every load is strict:
a file that is damaged, is not a brickwork file, or does not fit the spec raises an error naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.checkpoint import (
    is_complete,
    latest_checkpoint,
    read_checkpoint_weights,
    read_export,
    read_weights,
)
from brickwork.errors import ConfigError
from brickwork.factory.build import build_model
from brickwork.factory.hf import load_hf_checkpoint
from brickwork.factory.spec_io import dump_spec, load_spec, parse_spec

SPEC_FILE = "spec.yaml"
WEIGHTS_FILE = "model.safetensors"


def save_pretrained(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``model``'s spec and weights to ``directory`` (created if needed); returns it.

    ``model`` is one built by brickwork (it carries ``.spec``), whole in this process: gather a
    parallelized model's weights with ``brickwork.parallel.full_state_dict`` first. Each file is
    written beside its final name and renamed into place, so a folder never holds a half-written one,
    nor, after an overwrite cut short, one save's spec beside another's weights.
    """
    spec = getattr(model, "spec", None)
    if not isinstance(spec, Mapping):
        raise TypeError("save_pretrained needs a model built by brickwork.factory (its .spec is missing)")
    weights = unique_weights(model)
    split = [name for name, value in weights.items() if isinstance(value, DTensor)]
    if split:
        raise ValueError(
            f"{split[0]!r} is split over ranks (a DTensor): save the gathered weights of a parallelized "
            "model, brickwork.parallel.full_state_dict(model), from a single-process copy"
        )
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    spec_partial, weights_partial = _partial(folder / SPEC_FILE), _partial(folder / WEIGHTS_FILE)
    dump_spec(dict(spec), spec_partial)
    save_file(weights, weights_partial, metadata={"format": "pt"})
    # The old spec goes first and the new one last: a save cut short in between leaves no spec.yaml
    # (from_pretrained then says so), never a spec beside weights of the same shapes from another save.
    (folder / SPEC_FILE).unlink(missing_ok=True)
    os.replace(weights_partial, folder / WEIGHTS_FILE)
    os.replace(spec_partial, folder / SPEC_FILE)
    return folder


def unique_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s state dict with each tied Parameter once, under its first name, as contiguous CPU
    tensors."""
    seen: dict[int, str] = {}
    aliases = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            aliases.add(name)
        seen.setdefault(id(param), name)
    return {
        name: value.detach().cpu().contiguous()
        for name, value in model.state_dict().items()
        if name not in aliases
    }


@dataclass(frozen=True)
class Pretrained:
    """A model :func:`read_pretrained` read, and where from."""

    model: nn.Module
    checkpoint: Path | None = None  # the checkpoint folder read, for a run or checkpoint folder
    step: int | None = None  # the training step of a checkpoint, or of an export file that names one


def from_pretrained(path: str | os.PathLike) -> nn.Module:
    """The model saved at ``path``, with its weights, in train mode as ``build_model`` returns it.

    ``path`` is a :func:`save_pretrained` folder, a run folder or one complete checkpoint folder of
    ``brickwork train``, a ``.safetensors`` file written by ``brickwork export``, or an HF model
    folder (``config.json``; returned in eval mode, as ``load_hf_checkpoint`` does).
    FileNotFoundError when nothing is there; ValueError naming the file when it is damaged, not a
    brickwork file, or does not fit its spec.
    """
    return read_pretrained(path).model


def read_pretrained(path: str | os.PathLike, option: str = "path") -> Pretrained:
    """:func:`from_pretrained`'s model, with the checkpoint and step it came from; a ConfigError about
    a run folder's checkpoints names ``option``, the caller's name for ``path``."""
    source = Path(path)
    if source.is_file():
        return _from_export(source)
    if not source.is_dir():
        raise FileNotFoundError(f"{str(source)!r} does not exist")
    if (source / SPEC_FILE).is_file():
        spec = load_spec(source / SPEC_FILE)
        return Pretrained(_load(spec, read_weights(source / WEIGHTS_FILE), source / WEIGHTS_FILE))
    if (source / "config.json").is_file():
        return Pretrained(load_hf_checkpoint(source))
    if not is_complete(source) and not (source / "config.yaml").is_file():
        if _partial(source / SPEC_FILE).is_file():
            raise FileNotFoundError(
                f"{str(source)!r} holds a save_pretrained that was cut short before its {SPEC_FILE} was "
                "in place (the new files are the .partial ones beside it): save the model again"
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
    return Pretrained(_load(meta["spec"], weights, folder), folder, meta["step"])


def _from_export(file: Path) -> Pretrained:
    text, weights, metadata = read_export(file)
    try:
        spec = parse_spec(text, "json", source=f"{file} metadata")
    except ValueError as err:
        raise ValueError(f"the spec in {str(file)!r}'s metadata is damaged: {err}") from None
    step = metadata.get("step", "")
    return Pretrained(_load(spec, weights, file), step=int(step) if step.isdigit() else None)


def _load(spec: Mapping[str, Any], weights: dict[str, torch.Tensor], source: Path) -> nn.Module:
    try:
        model = build_model(spec)
    except ConfigError as err:  # a damaged spec, or one of an older brickwork: the file is what to name
        raise ValueError(f"the spec saved with {str(source)!r} does not build: {err}") from None
    try:
        model.load_state_dict(weights, strict=True)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"the weights in {str(source)!r} do not fit its spec: {err}") from None
    return model


def _partial(final: Path) -> Path:
    """Where ``final`` is written before it is renamed into place; the suffix names the format."""
    return final.with_name(f".{final.stem}.partial{final.suffix}")
