"""Every rank checks that all ranks were given the same model and dist dict before laying anything out.

Ranks launched with different specs (a stale config file on one node, an override given to one
process) would otherwise build shards of different shapes and wait forever in the first collective
whose sizes do not match. Here each rank hashes its dist dict, its model's spec and the names and
shapes of its model's state, and one ``all_gather`` of those hashes shows every rank the same picture:
a mismatch raises the same ConfigError on every rank, naming what differs and on which ranks.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from brickwork.errors import ConfigError
from brickwork.parallel.config import ParallelConfig

# The parts hashed, in order; each becomes two int64 words (128 bits of its SHA-256).
PARTS = ("dist dict", "model spec", "parameter names and shapes")


def _digest(value: Any) -> list[int]:
    text = json.dumps(value, sort_keys=True, default=repr)
    raw = hashlib.sha256(text.encode()).digest()
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in (0, 8)]


def fingerprint(model: nn.Module, config: ParallelConfig) -> torch.Tensor:
    """[2 * len(PARTS)] int64: the hashes of the resolved dist dict (defaults filled, so that equal
    layouts spelled differently agree), the model's ``spec`` and its state's shapes."""
    shapes = [(name, list(t.shape)) for name, t in model.state_dict().items()]
    words = _digest(config.to_dict()) + _digest(getattr(model, "spec", None)) + _digest(shapes)
    return torch.tensor(words, dtype=torch.int64)


def check_agreement(model: nn.Module, config: ParallelConfig) -> None:
    """Raise the same ConfigError on every rank unless every rank passed an identical model layout
    and dist dict. One all_gather of a few words; call it before the first collective of a layout."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    local = fingerprint(model, config).to(device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    table = torch.stack(gathered).cpu().view(len(gathered), len(PARTS), 2)
    differing = []
    for index, part in enumerate(PARTS):
        ranks = [r for r in range(len(gathered)) if not torch.equal(table[r, index], table[0, index])]
        if ranks:
            differing.append(f"the {part} of rank(s) {ranks} differ(s) from rank 0's")
    if differing:
        raise ConfigError(
            "the ranks were not given the same model and layout: "
            + "; ".join(differing)
            + ". Launch every process with the same spec, overrides and dist dict"
        )
