"""xformers' ``AttentionMask``: an additive mask (0 = attend, -inf = skip) with a causal flag."""

from __future__ import annotations

from typing import TypeVar

import torch

from brickwork.xformers._compat import require

Self = TypeVar("Self", bound="AttentionMask")


class AttentionMask:
    """An additive mask of shape ``[B|1, Tq, Tk]`` (a 2-D mask gains a leading 1)."""

    def __init__(self, additive_mask: torch.Tensor, is_causal: bool = False) -> None:
        require(
            additive_mask.is_floating_point(),
            f"an additive mask is a float tensor, got {additive_mask.dtype}",
        )
        require(not additive_mask.requires_grad, "an attention mask takes no gradient")
        if additive_mask.ndim == 2:
            additive_mask = additive_mask.unsqueeze(0)
        self.values = additive_mask
        self.is_causal = is_causal
        self.seq_len = additive_mask.shape[1]
        self.to_seq_len = additive_mask.shape[0]

    def to_bool(self) -> torch.Tensor:
        """True where the score is computed."""
        return self.values != float("-inf")

    @classmethod
    def from_bool(cls: type[Self], x: torch.Tensor) -> Self:
        """From a boolean pattern, True = attend."""
        require(x.dtype == torch.bool, f"from_bool takes a boolean tensor, got {x.dtype}")
        return cls(torch.zeros(x.shape, device=x.device).masked_fill(~x, float("-inf")))

    @classmethod
    def from_multiplicative(cls: type[Self], x: torch.Tensor) -> Self:
        """From a multiplicative mask: nonzero = attend."""
        require(x.dtype != torch.bool, "from_multiplicative takes a numeric tensor; use from_bool")
        return cls.from_bool(x.bool())

    @classmethod
    def make_causal(
        cls: type[Self],
        seq_len: int,
        to_seq_len: int | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> Self:
        """The ``[seq_len, to_seq_len]`` causal mask, aligned top-left as xformers did (key j > i skipped)."""
        to_seq_len = to_seq_len or seq_len
        keep = torch.ones(seq_len, to_seq_len, dtype=torch.bool, device=device).tril()
        values = torch.zeros(seq_len, to_seq_len, device=device, dtype=dtype or torch.float32)
        return cls(values.masked_fill(~keep, float("-inf")), is_causal=True)

    def make_crop(self, seq_len: int, to_seq_len: int | None = None) -> AttentionMask:
        """A view of the top-left ``[seq_len, to_seq_len]`` corner."""
        to_seq_len = to_seq_len or seq_len
        return AttentionMask(self.values[:, :seq_len, :to_seq_len], is_causal=self.is_causal)

    def __repr__(self) -> str:
        return f"AttentionMask - causal {self.is_causal} - mask {self.values}"

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def is_sparse(self) -> bool:
        return False

    @property
    def ndim(self) -> int:
        return self.values.ndim

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    def __add__(self, other: AttentionMask) -> AttentionMask:
        return AttentionMask(self.values + other.values, is_causal=False)

    def to(self, device: torch.device | None = None, dtype: torch.dtype | None = None) -> AttentionMask:
        """This mask on ``device`` / in ``dtype`` (itself when nothing changes)."""
        require(
            device is None or isinstance(device, torch.device),
            f"device must be a torch.device, got {device!r}",
        )
        require(
            dtype is None or isinstance(dtype, torch.dtype), f"dtype must be a torch.dtype, got {dtype!r}"
        )
        require(device is not None or dtype is not None, "give a device or a dtype")
        if (device is None or device == self.device) and (dtype is None or dtype == self.dtype):
            return self
        return AttentionMask(self.values.to(device=device, dtype=dtype), self.is_causal)
