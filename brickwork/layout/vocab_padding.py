"""A vocabulary padded inside a model, invisible from outside (Megatron's ``make_vocab_size_divisible_by``).

A model's token embedding and vocabulary head (an ``nn.Linear`` whose output columns are the
vocabulary) may hold more rows than the vocabulary has: a multiple of 64 gives the head's GEMMs
aligned shapes (GPT-2's 50257 becomes 50304), and tensor parallel pads a vocabulary its size does not
divide so that every rank holds the same number of rows. One :class:`VocabPadding` describes both:
``vocab`` real rows in ``padded`` over ``tp`` ranks, the padding at the end of each rank's shard (at
``tp=1``, the end of the table). Rank ``r`` holds its ``torch.chunk`` part of the real rows (the rows
an unpadded, unevenly sharded DTensor would give it) followed by zero rows, so on every rank the real
rows are a prefix of the local shard and the unpadded tensor is a view of that prefix.

:func:`pad_vocabulary` pads modules in place and marks them; from then on

- the head's output keeps only its real columns (a forward hook), so the logits have the vocabulary's
  width and padded columns take part in no softmax or loss (their weight rows get zero gradient);
- ``load_state_dict`` takes the real rows alone and pads them (a load pre-hook), or the padded rows;
- whatever writes weights out (``save_pretrained``, ``to_hf``, ``full_state_dict``, checkpoints) reads
  the marks (:func:`padded_names`) and keeps the real rows only.

A model pads its own vocabulary at ``tp=1``; tensor parallel lays a padded module out again for its
size (parallel/tensor/apply.py): the hook reads the module's current padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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

    def unpad(self, full: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """A whole padded tensor [padded, ...] (padded along ``dim``) -> its real rows [vocab, ...]; at
        ``tp=1`` a view of it."""
        if self.tp == 1:
            return full.narrow(dim, 0, self.vocab)
        return full.index_select(dim, self.real_index(full.device))

    def has_view(self, padded: torch.Tensor, dim: int = 0) -> bool:
        """Whether :meth:`unpadded_view` can show the real rows of ``padded`` as a view: at ``tp=1`` of
        a plain tensor, else of a DTensor sharded over one mesh dim of ``tp`` ranks."""
        if not isinstance(padded, DTensor):
            return self.tp == 1
        dim = dim % padded.dim()
        return tuple(padded.placements) == (Shard(dim),) and padded.device_mesh.size() == self.tp

    def unpadded_view(self, padded: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """The real rows of ``padded`` (padded along ``dim``), sharing its storage: a plain tensor's
        prefix, or the DTensor of the ``vocab`` rows, unevenly sharded as ``torch.chunk`` splits them.

        A tensor without such a view (:meth:`has_view`; e.g. FSDP's shards) raises ValueError.
        """
        dim = dim % padded.dim()
        if not self.has_view(padded, dim):
            placements = padded.placements if isinstance(padded, DTensor) else "a plain tensor"
            raise ValueError(
                f"a vocabulary padded over {self.tp} rank(s) is unpadded as a view from a tensor split "
                f"that way only, got {placements}; use full_state_dict() for this layout"
            )
        if not isinstance(padded, DTensor):
            return padded.narrow(dim, 0, self.vocab)
        mesh = padded.device_mesh
        rows = self.real_rows(mesh.get_local_rank())
        return _narrowed(padded, mesh, dim, rows, self.vocab)

    def real_columns(self, logits: torch.Tensor) -> torch.Tensor:
        """A head's output [..., padded] -> [..., vocab]: a view of the real columns (a DTensor of
        them where tensor parallel left the output split over the vocabulary)."""
        return self.unpadded_view(logits, dim=-1) if isinstance(logits, DTensor) else self.unpad(logits, -1)


def _narrowed(sharded: DTensor, mesh: DeviceMesh, dim: int, rows: int, global_rows: int) -> DTensor:
    local = sharded.to_local().narrow(dim, 0, rows)
    shape = list(sharded.shape)
    shape[dim] = global_rows
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(
        local, mesh, [Shard(dim)], run_check=False, shape=torch.Size(shape), stride=stride
    )


def module_padding(module: nn.Module) -> VocabPadding | None:
    """The padding of ``module``'s rows (the same for all its parameters), or None when unpadded."""
    return next(iter(getattr(module, PADDED_ATTR, {}).values()), None)


def pad_vocabulary(model: nn.Module, paths: list[str], padding: VocabPadding) -> None:
    """Give the ``nn.Embedding`` / ``nn.Linear`` modules at ``paths`` (before any sharding)
    ``padding.padded`` rows, in place, zeros in the padding. A Parameter they share (a tied embedding
    and head) is padded once, and every module of ``model`` holding it gets the padded one.

    A module padded before (a model's own ``tp=1`` padding) is laid out again from its real rows.
    A module padded for the first time gets the hooks of the module docstring.
    """
    new: dict[int, nn.Parameter] = {}
    for path in paths:
        module = model.get_submodule(path)
        before = module_padding(module)
        if before is None:
            if not isinstance(module, nn.Embedding):
                module.register_forward_hook(_real_columns_hook)
            module.register_load_state_dict_pre_hook(_pad_loaded_rows)
        names = []
        for name, param in module.named_parameters(recurse=False):
            if id(param) not in new:
                if param.is_meta:
                    data = torch.empty((padding.padded, *param.shape[1:]), dtype=param.dtype, device="meta")
                else:
                    data = padding.pad(param.data if before is None else before.unpad(param.data))
                new[id(param)] = nn.Parameter(data, requires_grad=param.requires_grad)
            names.append(name)
        if isinstance(module, nn.Embedding):
            module.num_embeddings = padding.padded
            if module.padding_idx is not None:
                # A tp=1 padding keeps every id's row, so the id is the row of the old table.
                module.padding_idx = int(padding.padded_ids(torch.tensor(module.padding_idx)))
        else:
            module.out_features = padding.padded
        setattr(module, PADDED_ATTR, dict.fromkeys(names, padding))
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) in new:
                module.register_parameter(name, new[id(param)])


def pad_own_vocabulary(model: nn.Module, paths: list[str], vocab_size: int, multiple: int) -> None:
    """A model's own padding: the ``vocab_size`` rows of the modules at ``paths`` padded to a multiple of
    ``multiple`` (``tp=1``), when that adds rows."""
    padding = VocabPadding.for_size(vocab_size, 1, multiple)
    if padding.padded > vocab_size:
        pad_vocabulary(model, paths, padding)


def _real_columns_hook(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    padding = next(iter(getattr(module, PADDED_ATTR).values()))  # read per call: a layout may change it
    return padding.real_columns(output)


def _pad_loaded_rows(module: nn.Module, state: dict[str, Any], prefix: str, *_: Any) -> None:
    """Pad the real rows alone, [vocab, ...], to the module's rows; padded ones load as they are."""
    for name, padding in getattr(module, PADDED_ATTR, {}).items():
        value = state.get(prefix + name)
        plain = isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.dim() >= 1
        if plain and value.shape[0] == padding.vocab:
            state[prefix + name] = padding.pad(value)


def padded_names(modules: list[nn.Module]) -> dict[str, VocabPadding]:
    """State-dict name -> padding for every padded parameter of ``modules`` (tied names too)."""
    out: dict[str, VocabPadding] = {}
    for module in modules:
        for prefix, sub in module.named_modules(remove_duplicate=False):
            for pname, padding in getattr(sub, PADDED_ATTR, {}).items():
                out[f"{prefix}.{pname}" if prefix else pname] = padding
    return out


def unpadded_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with the real rows of every padded parameter only (views of them)."""
    padded = padded_names([model])
    return {k: padded[k].unpad(v) if k in padded else v for k, v in model.state_dict().items()}
