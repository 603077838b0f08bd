"""Style names ("colwise", "rowwise", ...) turned into DTensor ParallelStyles.

torch's ColwiseParallel / RowwiseParallel shard ``nn.Linear`` (weight ``[out, in]``) and
``nn.Embedding``. Two more cases come up in models brickwork did not build, and are handled here on
the same machinery:

- transposed linears whose weight is ``[in, out]`` (HF's ``Conv1D`` in GPT-2, which exposes
  ``nx``/``nf``): the shard dims swap;
- packed projections such as GPT-2's fused ``c_attn`` (q | k | v along the output): ``"colwise:3"``
  splits each of the 3 segments across the ranks, so every rank gets its own heads of q, k and v.
  The columns are reordered before sharding; :func:`unpack_full` puts a gathered weight back.

A module applied to every head alike (a per-head q/k norm, whose weight spans ``dim_head``) sees only
this rank's heads: ``"per_head"`` replicates its parameters and takes its input ``[..., heads, D]`` as
sharded on the heads, so their gradients are summed over the ranks.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Placement, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
)

from brickwork.errors import ConfigError

STYLE_NAMES = ("colwise", "rowwise", "vocab", "sequence_parallel", "replicate", "per_head")

# Set on a module whose parameters were reordered for a packed colwise split: {param name: (dim, order)}.
PACKED_ATTR = "_brickwork_packed_order"


def parse_style(value: str, path: str) -> tuple[str, int]:
    """``"colwise:3"`` -> ("colwise", 3); ``"rowwise"`` -> ("rowwise", 1). ConfigError for unknown names."""
    if not isinstance(value, str):
        raise ConfigError(f"a style must be a string, got {value!r}", path, choices=STYLE_NAMES)
    name, _, count = value.partition(":")
    if name not in STYLE_NAMES:
        raise ConfigError(f"unknown tensor-parallel style {value!r}", path, choices=STYLE_NAMES, got=name)
    if not count:
        return name, 1
    if name != "colwise" or not count.isdigit() or int(count) < 1:
        raise ConfigError(f"only colwise takes a packed segment count (colwise:N), got {value!r}", path)
    return name, int(count)


def is_transposed_linear(module: nn.Module) -> bool:
    """A linear that stores its weight as [in, out] and says so through ``nx``/``nf`` (HF Conv1D)."""
    weight = getattr(module, "weight", None)
    nx, nf = getattr(module, "nx", None), getattr(module, "nf", None)
    return (
        not isinstance(module, nn.Linear)
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and tuple(weight.shape) == (nx, nf)
    )


def packed_order(size: int, segments: int, tp: int) -> torch.Tensor:
    """Index order that makes contiguous tp-chunks hold chunk r of every one of ``segments`` segments."""
    seg = size // segments
    part = seg // tp
    index = torch.arange(size).view(segments, tp, part)  # [segment, rank, j]
    return index.transpose(0, 1).reshape(-1)


def packed_names(modules: list[nn.Module]) -> dict[str, tuple[int, torch.Tensor]]:
    """State-dict name -> (packed dim, :func:`packed_order`) for every parameter of ``modules`` that a
    ``colwise:N`` split reordered (tied names too)."""
    out = {}
    for module in modules:
        for prefix, sub in module.named_modules(remove_duplicate=False):
            for pname, layout in getattr(sub, PACKED_ATTR, {}).items():
                out[f"{prefix}.{pname}" if prefix else pname] = layout
    return out


def unpack_full(full: torch.Tensor, dim: int, order: torch.Tensor) -> torch.Tensor:
    """Undo :func:`packed_order` on a gathered tensor."""
    return full.index_select(dim, torch.argsort(order))


def _distribute(style: ColwiseParallel | RowwiseParallel, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """``module`` sharded by ``style``'s own ``_partition``, with its input and output layouts: what
    torch's styles do for the modules they know, for the ones they do not."""
    return distribute_module(
        module,
        mesh,
        style._partition,
        partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts),
        partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),
    )


class _Colwise(ColwiseParallel):
    """ColwiseParallel that also takes transposed linears and packed outputs."""

    def __init__(self, *, segments: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.segments = segments

    def _partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        out_dim = 1 if is_transposed_linear(module) else 0
        orders = {}
        for pname, param in list(module.named_parameters(recurse=False)):
            dim = out_dim if param.dim() == 2 else 0
            data = param.data
            if self.segments > 1:
                order = packed_order(data.shape[dim], self.segments, mesh.size())
                data = data.index_select(dim, order.to(data.device)) if not data.is_meta else data
                orders[pname] = (dim, order)
            sharded = distribute_tensor(data, mesh, [Shard(dim)], src_data_rank=self.src_data_rank)
            module.register_parameter(pname, nn.Parameter(sharded, requires_grad=param.requires_grad))
        if orders:
            setattr(module, PACKED_ATTR, orders)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        # Else a packed or transposed linear: checks.py refused any other module before the layout.
        if isinstance(module, nn.Embedding) or (isinstance(module, nn.Linear) and self.segments == 1):
            return super()._apply(module, device_mesh)
        return _distribute(self, module, device_mesh)


class _Rowwise(RowwiseParallel):
    """RowwiseParallel that also takes transposed linears."""

    def _partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        weight = distribute_tensor(module.weight.data, mesh, [Shard(0)], src_data_rank=self.src_data_rank)
        module.register_parameter("weight", nn.Parameter(weight, requires_grad=module.weight.requires_grad))
        if getattr(module, "bias", None) is not None:
            bias = distribute_tensor(module.bias.data, mesh, [Replicate()], src_data_rank=self.src_data_rank)
            module.register_parameter("bias", nn.Parameter(bias, requires_grad=module.bias.requires_grad))

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if isinstance(module, nn.Linear | nn.Embedding):
            return super()._apply(module, device_mesh)
        # A transposed linear: checks.py refused any other module before the layout.
        self.desired_input_layouts = (Shard(-1),)
        return _distribute(self, module, device_mesh)


def make_style(
    name: str,
    *,
    segments: int = 1,
    sequence_parallel: bool = False,
    model_output: bool = False,
) -> ParallelStyle | None:
    """The DTensor style for one plan entry.

    ``sequence_parallel``: activations between blocks are sharded on the sequence dim (dim 1), so a
    rowwise output is reduce-scattered onto it, and an output projection all-gathers its input.
    ``model_output=True`` marks a colwise layer whose output leaves the model (the LM head): it stays
    a DTensor sharded on its last dim, for loss-parallel cross entropy. "replicate" (and
    "sequence_parallel" without SP) need nothing; "per_head" shards its input on the heads (dim -2).
    """
    seq: Placement = Shard(1)
    if name == "colwise":
        if not model_output:
            return _Colwise(segments=segments)
        return _Colwise(
            segments=segments,
            input_layouts=seq if sequence_parallel else Replicate(),
            output_layouts=Shard(-1),
            use_local_output=False,
        )
    if name == "rowwise":
        return _Rowwise(output_layouts=seq if sequence_parallel else Replicate())
    if name == "vocab":
        # Replicated output, even under SP: additive position embeddings must see the whole sequence;
        # the split onto the sequence dim happens at the first layer.
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if name == "sequence_parallel":
        return SequenceParallel(use_local_output=True) if sequence_parallel else None
    if name == "per_head":
        return SequenceParallel(sequence_dim=-2, use_local_output=True)
    if name == "replicate":
        return None
    raise ConfigError(f"unknown tensor-parallel style {name!r}", choices=STYLE_NAMES, got=name)
