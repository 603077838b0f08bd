"""Context parallel refusals that need no process group: the dist key, and models it cannot split."""

from __future__ import annotations

import pytest
import torch
from context_parallel_cases import build
from torch import nn

from brickwork.components.attention import ATTENTION_REGISTRY, MultiHeadAttention
from brickwork.components.positional.alibi import ALiBi
from brickwork.errors import ConfigError
from brickwork.factory import build_model, get_preset
from brickwork.parallel import ParallelConfig
from brickwork.parallel.context_parallel import check_context_parallel

CP2 = 2
# Options a few mechanisms need to be built at this size (as in the attention contract tests).
OPTIONS = {
    "linformer": {"seq_len": 8},
    "nystrom": {"num_landmarks": 2},
    "ortho": {"num_landmarks": 2},
    "lambda_layer": {"seq_len": 8},
    "blocksparse": {"block_size": 4},
}
UNSAFE = [n for n in ATTENTION_REGISTRY.names() if not ATTENTION_REGISTRY.get(n).context_parallel_safe]


@pytest.mark.parametrize(
    ("dist", "key", "words"),
    [
        ({"context_parallel_size": 0}, "context_parallel_size", "positive integer"),
        ({"context_parallel_size": "2"}, "context_parallel_size", "expected int, got str '2'"),
    ],
)
def test_bad_dist_keys_raise_config_error(dist: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as error:
        ParallelConfig.from_dict(dist)
    assert key in str(error.value)


def test_world_size_counts_context_parallel() -> None:
    assert (
        ParallelConfig.from_dict(
            {"context_parallel_size": 2, "tensor_parallel_size": 2}, world_size=8
        ).data_parallel_size
        == 2
    )
    with pytest.raises(
        ConfigError,
        match=r"context_parallel_size \(2\) × tensor_parallel_size \(1\) = 2, but the world size is 4",
    ):
        ParallelConfig.from_dict({"data_parallel_size": 1, "context_parallel_size": 2}, world_size=4)


def test_decoders_and_encoders_with_exact_attention_pass() -> None:
    for kind in ("llama", "gpt", "alibi", "encoder"):
        check_context_parallel(build(kind), CP2)


@pytest.mark.parametrize("name", UNSAFE)
def test_a_mechanism_without_exact_softmax_attention_is_refused(name: str) -> None:
    model = nn.Sequential(MultiHeadAttention(16, 2, attention=name, attention_options=OPTIONS.get(name)))
    with pytest.raises(ConfigError, match="context_parallel_size") as error:
        check_context_parallel(model, CP2)
    message = str(error.value)
    assert f"attention {name!r} at 0 cannot run" in message and "'scaled_dot_product'" in message


def test_a_model_without_brickwork_attention_is_refused() -> None:
    with pytest.raises(ConfigError, match="Linear has none"):
        check_context_parallel(nn.Linear(4, 4), CP2)


def test_alibi_on_a_bidirectional_layer_is_refused() -> None:
    layer = MultiHeadAttention(16, 2, position_bias=ALiBi(2, symmetric=True))
    with pytest.raises(ConfigError, match="ALiBi on a non-causal layer"):
        check_context_parallel(nn.Sequential(layer), CP2)


def test_a_plain_function_as_rotary_hook_is_refused() -> None:
    layer = MultiHeadAttention(16, 2, causal=True, rotary=lambda q, k, offset=0: (q, k))
    with pytest.raises(ConfigError, match="plain callable"):
        check_context_parallel(nn.Sequential(layer), CP2)


@pytest.mark.parametrize(
    ("preset", "reads"), [("t5-small", "a source and a target sequence"), ("vit", "images")]
)
def test_a_model_that_reads_more_than_one_token_sequence_is_refused(preset: str, reads: str) -> None:
    """The train step splits a row's token ids (brickwork/train/batch.py); an encoder-decoder's
    target or an image is not one, so the refusal comes at parallelize, before any step."""
    with torch.device("meta"):
        model = build_model(get_preset(preset))
    with pytest.raises(ConfigError, match=f"{type(model).__name__} reads {reads}") as error:
        check_context_parallel(model, CP2)
    assert error.value.path == "context_parallel_size"
