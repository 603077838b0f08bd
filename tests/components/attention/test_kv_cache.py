"""KVCache appends along the sequence and refuses k/v that do not continue it."""

import pytest
import torch

from brickwork.components.attention import KVCache


def test_update_appends_and_counts() -> None:
    cache = KVCache()
    assert cache.length == 0
    k1, v1 = torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8)
    k2, v2 = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 1, 8)
    assert cache.update(k1, v1) == (k1, v1)
    keys, values = cache.update(k2, v2)
    assert cache.length == 5
    assert torch.equal(keys, torch.cat([k1, k2], dim=2)) and torch.equal(values, torch.cat([v1, v2], dim=2))
    cache.reset()
    assert cache.length == 0 and cache.keys is None


def test_mismatched_updates_raise() -> None:
    cache = KVCache()
    with pytest.raises(ValueError, match=r"\[B, Hkv, T, D\]"):
        cache.update(torch.randn(2, 4, 8), torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match=r"\(2, 3, 4, 8\) and \(2, 3, 4, 6\)"):
        cache.update(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 6))
    cache.update(torch.randn(2, 3, 4, 8), torch.randn(2, 3, 4, 8))
    with pytest.raises(ValueError, match="do not continue"):
        cache.update(torch.randn(2, 2, 1, 8), torch.randn(2, 2, 1, 8))
