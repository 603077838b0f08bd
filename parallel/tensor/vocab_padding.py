"""A vocabulary that tensor parallel does not divide, padded inside the model (Megatron's
``make_vocab_size_divisible_by``), invisible from outside.

The vocabulary-parallel embedding and the LM head (a colwise layer whose output leaves the model)
get ``padded`` rows, a multiple of ``tp × vocab_multiple``, so every rank holds the same number of
rows and the GEMMs have even shapes. The padding is laid out per shard, not at the end: rank ``r``
holds its ``torch.chunk`` part of the real rows (the rows an unpadded, unevenly sharded DTensor
would give it) followed by zero rows. So on every rank the real rows are a prefix of the local
shard, and the unpadded tensor is a DTensor view of that prefix sharing storage with the parameter:

- token ids are moved to their padded row before the lookup;
- the head's logits keep only the real columns of each local shard before they leave it, so the
  model's output has the unpadded width, and padded columns take no part in any softmax or loss
  (their weight rows get zero gradient);
- checkpoints hold the unpadded views (they reshard to any TP size, whose padding differs), and
  ``full_state_dict`` drops the padded rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

# Set on a module whose parameters were padded: {param name: VocabPadding} (rows are dim 0).
PADDED_ATTR = "_brickwork_vocab_padding"


@dataclass(frozen=True)
class VocabPadding:
    """``vocab`` real rows padded to ``padded`` over ``tp`` ranks, the padding at the end of each shard."""

    vocab: int
    padded: int
    tp: int

    @classmethod
    def for_size(cls, vocab: int, tp: int, multiple: int) -> VocabPadding:
        """The smallest multiple of ``tp × multiple`` that holds ``vocab`` rows."""
        unit = tp * multiple
        return cls(vocab, -(-vocab // unit) * unit, tp)

    @property
    def shard_rows(self) -> int:
        """Rows per rank, padding included."""
        return self.padded // self.tp

    @property
    def chunk(self) -> int:
        """Real rows per rank as ``torch.chunk`` splits them (the last ranks may hold fewer)."""
        return -(-self.vocab // self.tp)

    def real_rows(self, rank: int) -> int:
        """How many real rows rank ``rank`` holds: its chunk of the unpadded vocabulary."""
        return max(0, min(self.chunk, self.vocab - rank * self.chunk))

    def padded_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Token ids [...] -> their rows in the padded table [...]."""
        return ids + torch.div(ids, self.chunk, rounding_mode="floor") * (self.shard_rows - self.chunk)

    def real_index(self, device: torch.device | None = None) -> torch.Tensor:
        """[vocab]: the padded row of every real row."""
        return self.padded_ids(torch.arange(self.vocab, device=device))

    def pad(self, full: torch.Tensor) -> torch.Tensor:
        """A whole unpadded tensor [vocab, ...] -> the padded one [padded, ...], zeros in the padding."""
        out = full.new_zeros((self.padded, *full.shape[1:]))
        return out.index_copy(0, self.real_index(full.device), full)

    def unpad(self, full: torch.Tensor) -> torch.Tensor:
        """A whole padded tensor [padded, ...] -> its real rows [vocab, ...]."""
        return full.index_select(0, self.real_index(full.device))

    def unpadded_view(self, sharded: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """A DTensor of ``padded`` rows (dim ``dim``) sharded over one mesh dim -> the DTensor of its
        ``vocab`` real rows, unevenly sharded as ``torch.chunk`` splits them, sharing its storage.

        A tensor that is not such a DTensor (e.g. FSDP's over a 2-D mesh) raises ValueError.
        """
        dim = dim % sharded.dim()
        if not isinstance(sharded, DTensor) or tuple(sharded.placements) != (Shard(dim),):
            placements = sharded.placements if isinstance(sharded, DTensor) else "a plain tensor"
            raise ValueError(
                f"a padded vocabulary is unpadded from a DTensor sharded on one mesh dim only, got "
                f"{placements}; use full_state_dict() for this layout"
            )
        mesh = sharded.device_mesh
        rows = self.real_rows(mesh.get_local_rank())
        return _narrowed(sharded, mesh, dim, rows, self.vocab)


def _narrowed(sharded: DTensor, mesh: DeviceMesh, dim: int, rows: int, global_rows: int) -> DTensor:
    local = sharded.to_local().narrow(dim, 0, rows)
    shape = list(sharded.shape)
    shape[dim] = global_rows
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(
        local, mesh, [Shard(dim)], run_check=False, shape=torch.Size(shape), stride=stride
    )


def pad_vocabulary(model: nn.Module, paths: list[str], padding: VocabPadding) -> None:
    """Give the ``nn.Embedding`` / ``nn.Linear`` modules at ``paths`` (before sharding) ``padding.padded``
    rows, in place. A Parameter they share (a tied embedding and head) is padded once, and every
    module of ``model`` holding it gets the padded one."""
    new: dict[int, nn.Parameter] = {}
    for path in paths:
        module = model.get_submodule(path)
        names = []
        for name, param in module.named_parameters(recurse=False):
            if id(param) not in new:
                if param.is_meta:
                    data = torch.empty((padding.padded, *param.shape[1:]), dtype=param.dtype, device="meta")
                else:
                    data = padding.pad(param.data)
                new[id(param)] = nn.Parameter(data, requires_grad=param.requires_grad)
            names.append(name)
        if isinstance(module, nn.Embedding):
            module.num_embeddings = padding.padded
            if module.padding_idx is not None:
                module.padding_idx = int(padding.padded_ids(torch.tensor(module.padding_idx)))
        else:
            module.out_features = padding.padded
        setattr(module, PADDED_ATTR, dict.fromkeys(names, padding))
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) in new:
                module.register_parameter(name, new[id(param)])


def pad_source(model: nn.Module, source: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rank 0's unpadded full state dict (meta init, parallel/materialize.py) with ``model``'s padded
    parameters padded, so it loads into the padded shards."""
    padded = padded_names([model])
    return {k: padded[k].pad(v) if k in padded else v for k, v in source.items()}


def remap_ids_hook(padding: VocabPadding) -> Callable[[nn.Module, tuple], tuple]:
    """A forward pre-hook for the embedding: token ids -> padded rows.

    An id outside the vocabulary never reaches it: the range check that ``apply_tensor_parallel``
    registers first raises (tensor/layers.py, check_token_ids)."""

    def hook(module: nn.Module, args: tuple) -> tuple:
        return (padding.padded_ids(args[0]), *args[1:])

    return hook


def unpad_logits_hook(padding: VocabPadding) -> Callable[[nn.Module, tuple, torch.Tensor], torch.Tensor]:
    """A forward hook for the head: its vocabulary-sharded logits [..., padded] -> [..., vocab]."""

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return padding.unpadded_view(output, dim=-1)

    return hook


def padded_names(modules: list[nn.Module]) -> dict[str, VocabPadding]:
    """State-dict name -> padding for every padded parameter of ``modules`` (tied names too)."""
    out: dict[str, VocabPadding] = {}
    for module in modules:
        for prefix, sub in module.named_modules(remove_duplicate=False):
            for pname, padding in getattr(sub, PADDED_ATTR, {}).items():
                out[f"{prefix}.{pname}" if prefix else pname] = padding
    return out
