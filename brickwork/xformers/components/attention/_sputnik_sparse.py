"""xformers' ``SparseCS`` mask: a boolean pattern held as a torch sparse tensor (True = attend)."""

from __future__ import annotations

import torch


class SparseCS:
    """A ``[Tq, Tk]`` or ``[B, Tq, Tk]`` attention pattern stored sparse (only the kept pairs).

    brickwork's attention reads it back as a dense boolean mask (SDPA takes dense masks)."""

    def __init__(self, matrix: torch.Tensor, device: torch.device | str | None = None) -> None:
        matrix = matrix.to(device) if device is not None else matrix
        if matrix.ndim == 2:
            matrix = matrix.unsqueeze(0)
        self.shape = matrix.shape
        self.values = matrix.bool().to_sparse()

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        return torch.bool

    @property
    def is_sparse(self) -> bool:
        return True

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def to_dense(self) -> torch.Tensor:
        """The pattern as a dense boolean ``[B|1, Tq, Tk]`` tensor."""
        return self.values.to_dense().reshape(self.shape)

    def to(self, device: torch.device | str) -> SparseCS:
        return SparseCS(self.to_dense(), device)
