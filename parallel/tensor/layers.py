"""Megatron-style tensor-parallel layers for hand-written parallel code, on DTensor.

The same layer runs on one process and under any mesh: with ``mesh=None`` (or a tensor-parallel
dim of size 1) it is exactly the plain torch layer; under a mesh its parameters are DTensors sharded
over the mesh's ``"tp"`` dim (or the only dim of a 1-D mesh), and the collectives are DTensor
redistributions, so autograd inserts the matching ones in backward.

- :class:`ColumnParallelLinear` splits the output features: each rank computes its columns of
  ``x @ W.T``; ``gather_output=True`` all-gathers them into the full output.
- :class:`RowParallelLinear` splits the input features: each rank multiplies its slice of the input
  by its rows of ``W.T`` and the partial sums are all-reduced. ``input_is_parallel=True`` takes the
  already split input (a ColumnParallelLinear's output), so a column/row pair communicates once.
- :class:`VocabParallelEmbedding` splits the vocabulary: each rank looks up the ids it holds, the
  others contribute zeros, and the partial rows are all-reduced. An id outside the vocabulary would
  find no rank holding it and embed as zeros; :func:`check_token_ids` makes it the error a plain
  embedding raises instead.

Parameters are initialised as the plain torch layer would be from the same RNG state on every
rank, then each rank keeps its shard, so a model seeded alike on one process and on many holds the
same weights.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor


def tensor_parallel_mesh(mesh: DeviceMesh | None) -> DeviceMesh | None:
    """The 1-D tensor-parallel mesh of ``mesh``: its ``"tp"`` dim, or itself if 1-D; None for one process."""
    if mesh is None:
        return None
    if mesh.ndim == 1:
        tp_mesh = mesh
    elif mesh.mesh_dim_names is not None and "tp" in mesh.mesh_dim_names:
        tp_mesh = mesh["tp"]
    else:
        raise ValueError(
            f"a {mesh.ndim}-D mesh needs a dim named 'tp' for tensor parallel layers; "
            f"it has {mesh.mesh_dim_names}"
        )
    return tp_mesh if tp_mesh.size() > 1 else None


def _shard_parameter(
    parameter: nn.Parameter | None, mesh: DeviceMesh | None, placement: Placement
) -> nn.Parameter | None:
    if parameter is None or mesh is None:
        return parameter
    return nn.Parameter(distribute_tensor(parameter.detach(), mesh, [placement]))


class _ParallelLinear(nn.Module):
    """What the column and row layers share: an ``nn.Linear``'s parameters, initialised whole and split."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        mesh: DeviceMesh | None,
        placements: tuple[Placement, Placement],
        device: torch.device | str | None,
        dtype: torch.dtype | None,
    ) -> None:
        super().__init__()
        full = nn.Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.in_features, self.out_features = in_features, out_features
        self.mesh = tensor_parallel_mesh(mesh)
        self.weight = _shard_parameter(full.weight, self.mesh, placements[0])
        self.bias = _shard_parameter(full.bias, self.mesh, placements[1])

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class ColumnParallelLinear(_ParallelLinear):
    """``y = x @ W.T + b`` with ``W`` [out, in] split by rows (output features) over the tp ranks.

    Input: x [..., in], the same on every tp rank. Output: [..., out] with ``gather_output=True``,
    else this rank's [..., out / tp] slice (in rank order).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        gather_output: bool = False,
        mesh: DeviceMesh | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, mesh, (Shard(0), Shard(0)), device, dtype)
        self.gather_output = gather_output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mesh is None:
            return F.linear(x, self.weight, self.bias)
        y = F.linear(DTensor.from_local(x, self.mesh, [Replicate()], run_check=False), self.weight, self.bias)
        if self.gather_output:
            y = y.redistribute(self.mesh, [Replicate()])
        return y.to_local()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, gather_output={self.gather_output}"


class RowParallelLinear(_ParallelLinear):
    """``y = x @ W.T + b`` with ``W`` [out, in] split by columns (input features) over the tp ranks.

    Input: this rank's [..., in / tp] slice with ``input_is_parallel=True`` (e.g. a
    ColumnParallelLinear's output), else the full [..., in]. Output: the full [..., out] on every rank.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        input_is_parallel: bool = True,
        mesh: DeviceMesh | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, mesh, (Shard(1), Replicate()), device, dtype)
        self.input_is_parallel = input_is_parallel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mesh is None:
            return F.linear(x, self.weight, self.bias)
        if self.input_is_parallel:
            x = DTensor.from_local(x, self.mesh, [Shard(-1)], run_check=False)
        else:
            x = DTensor.from_local(x, self.mesh, [Replicate()], run_check=False).redistribute(
                self.mesh, [Shard(-1)]
            )
        # The bias is added once, after the all-reduce of the partial products, not on every rank.
        y = F.linear(x, self.weight).redistribute(self.mesh, [Replicate()])
        if self.bias is not None:
            y = y + self.bias
        return y.to_local()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, input_is_parallel={self.input_is_parallel}"


def check_token_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """Raise unless every id is in ``[0, vocab_size)``, as a plain embedding lookup does.

    On CPU: IndexError naming the ids found. On an accelerator: an asynchronous device-side assert
    (a plain CUDA embedding fails the same way), so the check never waits for the device.
    """
    if ids.device.type == "cpu" and not torch.compiler.is_compiling():
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise IndexError(
                f"token ids must be in [0, {vocab_size}), got ids from {int(ids.min())} to {int(ids.max())}"
            )
        return
    torch._assert_async(((ids >= 0) & (ids < vocab_size)).all(), f"token ids must be in [0, {vocab_size})")


def ids_in_range_hook(vocab_size: int) -> Callable[[nn.Module, tuple], None]:
    """A forward pre-hook for a vocabulary-parallel ``nn.Embedding``: :func:`check_token_ids` on its input."""

    def hook(module: nn.Module, args: tuple) -> None:
        check_token_ids(args[0], vocab_size)

    return hook


class VocabParallelEmbedding(nn.Module):
    """An embedding table [num_embeddings, dim] split by vocabulary rows over the tp ranks.

    Input: ids [...] (any shape), the same on every tp rank. Output: [..., dim] on every rank.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        mesh: DeviceMesh | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        full = nn.Embedding(num_embeddings, embedding_dim, device=device, dtype=dtype)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.mesh = tensor_parallel_mesh(mesh)
        self.weight = _shard_parameter(full.weight, self.mesh, Shard(0))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.mesh is None:
            return F.embedding(ids, self.weight)
        check_token_ids(ids, self.num_embeddings)
        ids = DTensor.from_local(ids, self.mesh, [Replicate()], run_check=False)
        return F.embedding(ids, self.weight).redistribute(self.mesh, [Replicate()]).to_local()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "tensor_parallel_mesh",
]
