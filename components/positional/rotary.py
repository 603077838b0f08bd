"""Rotary position embedding (Su et al. 2021, RoFormer), applied to queries and keys."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from brickwork.checks import Flag, PositiveFloat, PositiveInt
from brickwork.errors import ConfigError

from .base import PositionalEncoding, check_offset, check_positions, register_positional
from .rotary_scaling import check_scaling, rotary_inv_freq

# (rotary_dim, base, scaling, max_seq_len, device, "cos" | "sin") -> the cached table. Weak, so a table
# lives as long as some module holds it; the tables are never written in place.
_SHARED_TABLES: weakref.WeakValueDictionary[tuple, torch.Tensor] = weakref.WeakValueDictionary()


def rotary_dim(dim_head: int, fraction: float) -> int:
    """Channels that rotate: ``int(dim_head * fraction)`` (the rest pass through)."""
    return int(dim_head * fraction)


@register_positional("rotary")
class RotaryEmbedding(PositionalEncoding):
    """Rotates channel pairs of q and k by ``position * inv_freq``: ``forward(q, k, offset=0) -> (q, k)``.

    q ``[B, H, T, D]``, k ``[B, Hkv, T, D]`` with ``D = dim_head``; position ``offset + t`` at index ``t``
    (``positions[b, t]`` given ``positions`` [B, T], HF's ``position_ids``).
    Only the first ``int(D * fraction)`` channels rotate (partial rotary, GPT-NeoX / Phi). Pairing:
    ``interleaved=False`` pairs channel ``i`` with ``i + r/2`` (GPT-NeoX, Llama in HF); ``True`` pairs
    ``2i`` with ``2i+1`` (GPT-J, the original Llama). ``scaling`` extends the context: a mapping with
    ``type`` linear | ntk | yarn | llama3 and its options (see ``rotary_scaling``).

    The rotation runs in fp32 (fp64 for fp64 inputs) and is cast back. cos/sin for the first
    ``max_seq_len`` positions are cached; later positions are computed when asked. The rotation is
    ``x * cos + pair_swap(x) * sin`` with per-channel tables: elementwise, so the result keeps the
    memory layout of q and k (projected as ``[B, T, H, D]``) and attention's output needs no copy
    before ``out_proj``, eager or compiled.
    """

    position_kind = "rotary"

    def __init__(
        self,
        dim_head: PositiveInt,
        base: PositiveFloat = 10000.0,
        fraction: PositiveFloat = 1.0,
        interleaved: Flag = False,
        scaling: Mapping[str, Any] | None = None,
        max_seq_len: PositiveInt = 2048,
    ) -> None:
        super().__init__()
        self.dim_head = dim_head
        self.base = float(base)
        self.fraction = float(fraction)
        self.rotary_dim = rotary_dim(dim_head, fraction)
        self.interleaved = interleaved
        self.scaling = check_scaling(scaling)
        self.max_seq_len = max_seq_len
        inv_freq, self.attention_factor = rotary_inv_freq(self.rotary_dim, self.base, self.scaling)
        # Derived from the options, so kept out of checkpoints.
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.register_buffer("cos_cached", torch.empty(0), persistent=False)
        self.register_buffer("sin_cached", torch.empty(0), persistent=False)
        self.reset_parameters()

    @staticmethod
    def check_options(options: Any) -> None:
        if options.fraction > 1:
            raise ConfigError(f"must be in (0, 1], got {options.fraction!r}", "fraction")
        rotated = rotary_dim(options.dim_head, options.fraction)
        if rotated < 2 or rotated % 2:
            raise ConfigError(
                f"int(dim_head * fraction) = {rotated} rotating channels; it must be even and at least 2",
                "fraction",
            )
        scaling = check_scaling(options.scaling)
        if scaling is not None and scaling["type"] == "ntk" and rotated < 4:
            raise ConfigError("ntk scaling needs at least 4 rotating channels", "scaling.type")

    def reset_parameters(self) -> None:
        """Recompute ``inv_freq`` and the cos/sin cache (fp32) on the buffers' device.

        Every layer of a model has its own rotary module with the same options; their cos/sin caches
        are one pair of tensors (``_SHARED_TABLES``), not one per layer: at Llama 3's 131072 positions
        and 128 channels a pair is 64 MiB.
        """
        device = self.inv_freq.device
        inv_freq, _ = rotary_inv_freq(self.rotary_dim, self.base, self.scaling)
        self.inv_freq = inv_freq.to(device=device, dtype=torch.float32)
        key = (self.rotary_dim, self.base, repr(self.scaling), self.max_seq_len, str(device))
        cos, sin = _SHARED_TABLES.get((*key, "cos")), _SHARED_TABLES.get((*key, "sin"))
        if cos is None or sin is None:
            cos, sin = self._cos_sin(0, self.max_seq_len, device, torch.float32)
            _SHARED_TABLES[(*key, "cos")], _SHARED_TABLES[(*key, "sin")] = cos, sin
        self.cos_cached, self.sin_cached = cos, sin

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> RotaryEmbedding:
        # Casting the model (.half(), .to(bf16)) or materialising it from the meta device (.to_empty())
        # would also reach these buffers; rebuild them in fp32 instead so precision is never lost.
        super()._apply(fn, recurse)
        if self.inv_freq.device.type != "meta":
            self.reset_parameters()
        return self

    def _cos_sin(
        self, start: int, length: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[length, rotary_dim // 2]`` for positions ``start ..``, angles built in fp64."""
        positions = torch.arange(start, start + length, dtype=torch.float64)
        return self._cos_sin_at(positions, device, dtype)

    def _cos_sin_at(
        self, positions: torch.Tensor, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[*positions.shape, rotary_dim // 2]``, angles built in fp64 where the positions
        are (the device's own positions stay there: reading them back would wait for it)."""
        inv_freq, _ = rotary_inv_freq(self.rotary_dim, self.base, self.scaling)
        angles = (positions.double()[..., None] * inv_freq.to(positions.device)).to(device)
        cos, sin = angles.cos() * self.attention_factor, angles.sin() * self.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def cos_sin(
        self, offset: int, length: int, device: torch.device, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[length, rotary_dim // 2]`` for positions ``offset .. offset + length - 1``,
        already multiplied by ``attention_factor`` (YaRN)."""
        end = offset + length
        if (
            dtype == torch.float32
            and end <= self.max_seq_len
            and self.cos_cached.device == torch.device(device)
        ):
            return self.cos_cached[offset:end], self.sin_cached[offset:end]
        return self._cos_sin(offset, length, torch.device(device), dtype)

    def channel_cos_sin(
        self,
        offset: int,
        length: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`cos_sin` with one column per rotating channel, ``[length, rotary_dim]``: each
        frequency on both channels of its pair. Built per call from the cached half-width tables, which
        for a long ``max_seq_len`` are the larger cost. Given ``positions`` [B, T], the tables of those
        positions instead, ``[B, 1, T, rotary_dim]`` (broadcast over the heads)."""
        if positions is None:
            cos, sin = self.cos_sin(offset, length, device, dtype)
        else:
            cos, sin = (t.unsqueeze(1) for t in self._cos_sin_at(positions.to(device), device, dtype))
        if self.interleaved:
            return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)

    def rotate(self, x: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate one tensor ``[..., T, dim_head]`` whose index ``t`` is at position ``offset + t`` (at
        ``positions[b, t]`` when given, x ``[B, H, T, dim_head]``)."""
        self._check_head(x)
        compute = torch.promote_types(x.dtype, torch.float32)
        cos, sin = self._channel_tables(x, offset, positions, compute)
        return self._rotate(x, cos, sin)

    def _channel_tables(
        self, x: torch.Tensor, offset: int, positions: torch.Tensor | None, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if positions is None:
            return self.channel_cos_sin(check_offset(offset), x.shape[-2], x.device, dtype)
        check_positions(positions, x.shape[-2])
        return self.channel_cos_sin(0, x.shape[-2], x.device, dtype, positions=positions)

    def _check_head(self, x: torch.Tensor) -> None:
        if x.dim() < 2 or x.shape[-1] != self.dim_head:
            raise ValueError(f"expected [..., T, dim_head={self.dim_head}], got shape {tuple(x.shape)}")

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot = x[..., : self.rotary_dim].to(cos.dtype)
        # Pair (a, b) becomes (a cos - b sin, b cos + a sin); the multiply leads so that the output
        # takes rot's strides, not those of the swapped copy.
        rotated = (rot * cos + self._swap_pairs(rot) * sin).to(x.dtype)
        if self.rotary_dim == self.dim_head:
            return rotated
        return torch.cat((rotated, x[..., self.rotary_dim :]), dim=-1)

    def _swap_pairs(self, rot: torch.Tensor) -> torch.Tensor:
        """Each rotating pair (a, b) as (-b, a), in the pairing's channel order."""
        if self.interleaved:
            return torch.stack((-rot[..., 1::2], rot[..., 0::2]), dim=-1).flatten(-2)
        first, second = rot.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        for name, t in (("q", q), ("k", k)):
            if t.dim() != 4:
                raise ValueError(f"{name} must be [B, heads, T, dim_head], got shape {tuple(t.shape)}")
        if q.shape[-2] != k.shape[-2] or q.dtype != k.dtype or q.device != k.device:
            return self.rotate(q, offset, positions), self.rotate(k, offset, positions)
        for t in (q, k):
            self._check_head(t)
        # One pair of channel tables for both.
        compute = torch.promote_types(q.dtype, torch.float32)
        cos, sin = self._channel_tables(q, offset, positions, compute)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def extra_repr(self) -> str:
        return (
            f"dim_head={self.dim_head}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"interleaved={self.interleaved}, scaling={self.scaling}"
        )
