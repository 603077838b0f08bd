"""HF's KV cache behind brickwork's attention.

brickwork's self-attention keeps one :class:`~brickwork.components.attention.KVCache` per layer and
asks it two things: ``length`` (the cached positions) and ``update(k, v)`` (append, return all). HF's
``Cache`` (``DynamicCache``, which ``generate`` makes) holds the same ``[B, Hkv, T, D]`` tensors per
layer, so each layer of it is seen through :class:`CacheLayer` and HF's own cache does the keeping:
beam reordering, cropping, offloading are its. (A seq2seq decoder's cross-attention keeps nothing
there: it projects the encoder output again each step.)
"""

from __future__ import annotations

import torch
import transformers


class CacheLayer:
    """Layer ``index`` of an HF ``cache``, as a brickwork ``KVCache``."""

    def __init__(self, cache: transformers.Cache, index: int) -> None:
        self.cache, self.index = cache, index

    @property
    def length(self) -> int:
        return self.cache.get_seq_length(self.index)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append k/v ``[B, Hkv, T, D]``; returns the cached plus new pair."""
        return self.cache.update(k, v, self.index)


def layer_caches(cache: transformers.Cache, num_layers: int) -> list[CacheLayer]:
    """The ``num_layers`` layers of ``cache`` as the list of caches a brickwork model takes."""
    return [CacheLayer(cache, i) for i in range(num_layers)]
