"""Loading a local HF model folder (config.json + weights) without ``transformers`` installed.

Weights are read with ``safetensors`` (``model.safetensors``, or shards listed in
``model.safetensors.index.json``) or, only when no safetensors file is there, with
``torch.load(weights_only=True)`` (``pytorch_model.bin`` or its sharded index). A file that is
damaged, or that the restricted loader refuses (a pickle that would call something), is a ValueError
naming it, in brickwork's words: torch's own advises loading the file unrestricted.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from torch import nn

from brickwork.checkpoint import read_weights as read_safetensors
from brickwork.checkpoint.hf_folder import read_shards
from brickwork.checkpoint.safe_reader import refusal_reason

from .convert import build_from_hf


def load_hf_checkpoint(path: str | Path) -> nn.Module:
    """A brickwork model from an HF model folder, e.g. one written by ``save_pretrained``.

    The family comes from ``config.json``'s ``model_type`` and the head from its first
    ``architectures`` entry. Returns the model in eval mode, in the dtype the weights were stored in.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"HF checkpoint folder {str(folder)!r} does not exist")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{str(folder)!r} has no config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} must hold a JSON object, got {type(config).__name__}")
    architectures = config.get("architectures") or []
    if not architectures:
        raise ValueError(f"{config_path} names no 'architectures', so the model's head is unknown")
    state = read_weights(folder)
    model = build_from_hf(config, architectures[0], state)
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        model.to(dtypes.pop())
    return model.eval()


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's weight files, by name."""
    for index_name, reader in (
        ("model.safetensors.index.json", read_safetensors),
        ("pytorch_model.bin.index.json", _read_torch),
    ):
        single = folder / index_name.removesuffix(".index.json")
        if single.is_file():
            return reader(single)
        index = folder / index_name
        if index.is_file():
            return read_shards(index, reader)
    raise FileNotFoundError(
        f"{str(folder)!r} has no model.safetensors, pytorch_model.bin or a sharded index of either"
    )


def _read_torch(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as err:  # what a bad file raises
        reason = refusal_reason(err) or " ".join(str(err).split())[:200] or type(err).__name__
        raise ValueError(f"{str(path)!r} is not a readable PyTorch weights file: {reason}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict (got {type(state).__name__})")
    return state
