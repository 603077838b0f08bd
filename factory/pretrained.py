"""``save_pretrained`` / ``from_pretrained``: a model's spec and weights in a folder, as HF keeps them.

The files, and the forms a saved model takes on disk (a ``brickwork.hf`` class's folder among them),
are ``brickwork.checkpoint``'s; here the spec becomes a model again. ``from_pretrained`` also reads an
HF model folder through the HF converter. Every load is strict: a file that is damaged, is not a
brickwork file, or does not fit the spec raises an error naming it. Nothing is pickled.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path

from torch import nn
from torch.distributed.tensor import DTensor

from brickwork.checkpoint import SavedModel, read_saved_model, unique_weights, write_saved_model
from brickwork.errors import ConfigError
from brickwork.factory.build import build_model
from brickwork.factory.hf import brickwork_folder, checkpoint
from brickwork.factory.spec_io import dump_spec, load_spec, parse_spec


def save_pretrained(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``model``'s spec, weights and HF's config.json to ``directory`` (created if needed).

    ``model`` is one built by brickwork (it carries ``.spec``), whole in this process: gather a
    parallelized model's weights with ``brickwork.parallel.full_state_dict`` first.
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
    config = brickwork_folder.hf_config_dict(spec)  # None for a model without a head HF has
    return write_saved_model(Path(directory), functools.partial(dump_spec, dict(spec)), weights, config)


def from_pretrained(path: str | os.PathLike) -> nn.Module:
    """The model saved at ``path``, with its weights, in train mode as ``build_model`` returns it.

    ``path`` is a :func:`save_pretrained` folder (or a ``brickwork.hf`` class's), a run folder or one
    checkpoint folder of ``brickwork train``, a ``.safetensors`` file written by ``brickwork export``,
    or an HF model folder (``config.json``; returned in eval mode, as ``load_hf_checkpoint`` does).
    FileNotFoundError when nothing is there; ValueError naming the file when it is damaged, not a
    brickwork file, or does not fit its spec.
    """
    return read_pretrained(path)[0]


def read_pretrained(path: str | os.PathLike, option: str = "path") -> tuple[nn.Module, SavedModel | None]:
    """:func:`from_pretrained`'s model, with what it was read from (its checkpoint and step; None for
    an HF folder); a ConfigError about a run folder's checkpoints names ``option``, the caller's name
    for ``path``."""
    source = Path(path)
    saved = read_saved_model(source, option)
    if saved is None:  # an HF model folder of one of HF's own families
        return checkpoint.load_hf_checkpoint(source), None
    spec = saved.spec
    if isinstance(spec, Path):
        spec = load_spec(spec)
    elif isinstance(spec, str):
        try:
            spec = parse_spec(spec, "json", source=f"{source} metadata")
        except ValueError as err:
            raise ValueError(f"the spec in {str(source)!r}'s metadata is damaged: {err}") from None
    try:
        model = build_model(spec)
    except ConfigError as err:  # a damaged spec, or one of an older brickwork: the file is what to name
        raise ValueError(f"the spec saved with {str(saved.source)!r} does not build: {err}") from None
    try:
        model.load_state_dict(saved.weights, strict=True)
    except (RuntimeError, ValueError) as err:
        raise ValueError(f"the weights in {str(saved.source)!r} do not fit its spec: {err}") from None
    return model, saved
