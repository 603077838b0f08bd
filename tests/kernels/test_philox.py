"""The torch Philox against published test vectors and against Triton's own ``tl.randint``."""

import random

import pytest
import torch
import triton
import triton.language as tl
from kernel_testing import DEVICES

from brickwork.kernels.philox import _mulhilo, dropout_threshold, philox4x32, philox_randint

# Known-answer vectors for Philox4x32-10 from the Random123 distribution (kat_vectors):
# counter words, key words, expected output words.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_known_answer_vectors(counter, key, expected):
    words = philox4x32(tuple(torch.tensor([c], dtype=torch.int64) for c in counter), key)
    assert tuple(int(w) for w in words) == expected


def test_mulhilo_is_the_exact_64_bit_product():
    rng = random.Random(0)
    values = [0, 1, 0xFFFF, 0x10000, 0xFFFFFFFF] + [rng.getrandbits(32) for _ in range(200)]
    for a in (0xD2511F53, 0xCD9E8D57, 0xFFFFFFFF):
        hi, lo = _mulhilo(a, torch.tensor(values, dtype=torch.int64))
        for v, h, lw in zip(values, hi.tolist(), lo.tolist(), strict=True):
            assert (h << 32) | lw == a * v


@triton.jit
def _randint_kernel(offsets_ptr, out_ptr, n, seed, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    offsets = tl.load(offsets_ptr + i, mask=inside, other=0)
    tl.store(out_ptr + i, tl.randint(seed, offsets).to(tl.int64), mask=inside)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 + 7, 2**63 - 1])
def test_matches_triton_randint(device, seed):
    # Offsets past 2**32 exercise the high counter word.
    offsets = torch.cat([torch.arange(300), torch.tensor([2**31 - 1, 2**32 - 1, 2**32, 2**40 + 3])])
    offsets = offsets.to(device=device, dtype=torch.int64)
    out = torch.empty_like(offsets)
    _randint_kernel[(triton.cdiv(offsets.numel(), 128),)](offsets, out, offsets.numel(), seed, BLOCK=128)
    # tl.randint gives uint32 words; compare the low 32 bits of their int64 copies.
    assert torch.equal(out & 0xFFFFFFFF, philox_randint(seed, offsets))


def test_dropout_threshold():
    assert dropout_threshold(0.0) == 0  # every element kept
    assert dropout_threshold(0.5) == 2**30
    assert dropout_threshold(1 - 2**-40) == 2**31 - 1
