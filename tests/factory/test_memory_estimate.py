"""A model too large for memory is refused before any weight is allocated."""

from __future__ import annotations

import time

import pytest
import torch

from brickwork.factory import ConfigError, build_model, get_preset
from brickwork.memory import available_bytes, weight_bytes


def tiny(**changes: int) -> dict:
    spec = get_preset("gpt-tiny")
    spec.update(changes)
    return spec


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dim_model": 2**40}, "too large for any machine"),
        ({"vocab_size": 10**9}, r"weights would take 4\d\d\.\d GiB \(the largest, token_embedding\.weight"),
    ],
)
def test_a_model_beyond_memory_is_a_config_error_before_allocating(changes: dict, message: str) -> None:
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=message):
        build_model(tiny(**changes))
    assert time.perf_counter() - started < 10


def test_the_estimate_counts_the_real_models_bytes_with_tied_weights_once() -> None:
    model = build_model(tiny())
    unique = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    expected = sum(t.numel() * t.element_size() for t in unique.values())
    assert weight_bytes(model)[0] == expected
    assert 0 < expected < available_bytes(torch.device("cpu"))


def test_a_spec_beyond_host_memory_builds_on_the_meta_device() -> None:
    # 10**9 × 128 fp32 = 477 GiB of embedding: refused on the host, built on meta (nothing allocated).
    with torch.device("meta"):
        model = build_model(tiny(vocab_size=10**9))
    assert model.token_embedding.weight.is_meta
    assert model.token_embedding.weight.shape == (10**9, 128)
    with pytest.raises(ConfigError, match="weights would take"):
        build_model(tiny(vocab_size=10**9))
