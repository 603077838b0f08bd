"""Philox4x32-10 in plain torch: the same random bits as Triton's ``tl.randint(seed, offset)``.

Philox (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) is counter based: the
bits for element ``i`` depend only on the key (the seed) and the counter (``i``), never on how the work
is split into blocks. That is what lets a dropout kernel regenerate its mask in the backward pass
instead of storing it, and lets this torch twin rebuild the identical mask on any device.

``tl.randint(seed, offset)`` with int64 offsets runs 10 rounds on the counter
``(offset & 0xffffffff, offset >> 32, 0, 0)`` with key ``(seed & 0xffffffff, seed >> 32)`` and returns
the first output word. Everything here is int64 arithmetic on values below 2**32, with the 32x32-bit
products split into 16-bit halves so that no intermediate overflows int64.
"""

from __future__ import annotations

import torch

PHILOX_ROUNDS = 10
_MASK32 = 0xFFFFFFFF
_KEY_STEP = (0x9E3779B9, 0xBB67AE85)
_ROUND_MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * b`` for a 32-bit constant ``a`` and int64 ``b`` in [0, 2**32)."""
    low_product = a * (b & 0xFFFF)  # < 2**48
    high_product = a * (b >> 16)  # < 2**48; a * b == high_product * 2**16 + low_product
    middle = low_product + ((high_product & 0xFFFF) << 16)  # < 2**49
    return (high_product >> 16) + (middle >> 32), middle & _MASK32


def philox4x32(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[int, int],
    rounds: int = PHILOX_ROUNDS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox4x32 on four int64 tensors of 32-bit words with a two-word key; returns four such tensors."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    mult_a, mult_b = _ROUND_MULTIPLIERS
    for _ in range(rounds):
        hi_b, lo_b = _mulhilo(mult_b, c2)
        hi_a, lo_a = _mulhilo(mult_a, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_STEP[0]) & _MASK32
        k1 = (k1 + _KEY_STEP[1]) & _MASK32
    return c0, c1, c2, c3


def philox_randint(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """``tl.randint(seed, offsets)`` for int64 ``offsets`` >= 0: uint32 values held in int64."""
    offsets = offsets.to(torch.int64)
    zero = torch.zeros_like(offsets)
    counter = (offsets & _MASK32, offsets >> 32, zero, zero)
    return philox4x32(counter, (seed & _MASK32, (seed >> 32) & _MASK32))[0]


def dropout_threshold(p: float) -> int:
    """Integer threshold on the top 31 random bits: an element is kept when ``bits >> 1 >= threshold``.

    The keep probability is ``1 - threshold / 2**31``, i.e. ``1 - p`` to within 2**-32. Comparing
    integers (not floats) is what makes the kernel's and the twin's masks bit-identical.
    """
    return min(round(p * 2**31), 2**31 - 1)


def dropout_keep_mask(seed: int, p: float, numel: int, device: torch.device | str) -> torch.Tensor:
    """The kept elements [numel] (bool) for row-major element indices 0..numel-1, as the kernels draw them."""
    offsets = torch.arange(numel, dtype=torch.int64, device=device)
    return (philox_randint(seed, offsets) >> 1) >= dropout_threshold(p)
