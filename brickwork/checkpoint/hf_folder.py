"""A brickwork model in HF's folder form: the ``config.json`` that makes a folder load with
``AutoModelFor*.from_pretrained`` (through ``brickwork.hf``'s classes), and the weights those classes
save. Read and written here without ``transformers``.

The config holds HF's ``model_type`` (``"brickwork"``), the class of the model's head
(``architectures``) and the resolved ``spec``; ``brickwork.hf.BrickworkConfig`` derives HF's names for
what its own code reads (``vocab_size``, ``num_hidden_layers``, ...) from the spec again on every load.
The HF classes hold the brickwork model as their submodule ``model``, so their weights are its state
dict under ``model.``; ``save_pretrained`` writes them without it (HF's loader adds it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from brickwork.checkpoint.export import read_weights

MODEL_TYPE = "brickwork"
CONFIG_FILE = "config.json"
WEIGHT_PREFIX = "model."  # the HF classes' base_model_prefix, and a dot
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


def read_config(folder: Path) -> dict[str, Any] | None:
    """The folder's ``config.json`` as a dict, or None when it has none; ValueError naming the file
    when it is not a JSON object."""
    path = folder / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{str(path)!r} is not JSON: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object, got {type(config).__name__}")
    return config


def read_brickwork_folder(folder: Path, config: Mapping[str, Any]) -> tuple[Mapping, dict[str, torch.Tensor]]:
    """(spec, brickwork state dict) of a folder a brickwork HF class wrote (its ``save_pretrained``, HF's
    ``Trainer.save_model``): the weights without the ``model.`` prefix they all carry (weights that do
    not all carry it are read as they are). ValueError naming the file when the config has no spec."""
    spec = config.get("spec")
    if not isinstance(spec, Mapping):
        raise ValueError(f"{str(folder / CONFIG_FILE)!r} is a brickwork config without its 'spec'")
    if (folder / WEIGHTS_FILE).is_file() or not (folder / WEIGHTS_INDEX).is_file():
        weights = read_weights(folder / WEIGHTS_FILE)
    else:
        weights = read_shards(folder / WEIGHTS_INDEX, read_weights)
    if weights and all(k.startswith(WEIGHT_PREFIX) for k in weights):
        weights = {k.removeprefix(WEIGHT_PREFIX): v for k, v in weights.items()}
    return spec, weights


def read_shards(index: Path, reader: Callable[[Path], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every tensor of the shards an HF index file (``*.index.json``) lists, each file read by
    ``reader``; ValueError for an index without a weight map or naming a file outside its folder."""
    with open(index, encoding="utf-8") as f:
        weight_map = json.load(f).get("weight_map")
    if not isinstance(weight_map, dict):
        raise ValueError(f"{index} has no 'weight_map' object")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = (index.parent / shard).resolve()
        if index.parent.resolve() not in shard_path.parents:
            raise ValueError(f"{index} points outside its folder: {shard!r}")
        state.update(reader(shard_path))
    return state
