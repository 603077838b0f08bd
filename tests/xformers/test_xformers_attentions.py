"""Every registered xformers-style mechanism through ``MultiHeadDispatch`` (ported from xformers'
test_attentions and test_compositional_attention), on CPU. The option grids are sampled
deterministically (every case of each mechanism, every option value, fewer combinations)."""

from __future__ import annotations

import itertools
import math
import random
import warnings

import pytest
import torch

from brickwork.xformers.components import InputProjection, InputProjectionConfig, MultiHeadDispatch
from brickwork.xformers.components.attention import _DENSITY_THRESHOLD, ATTENTION_REGISTRY, build_attention

BATCH, SEQ, MODEL = 2, 36, 16
NAMES = sorted(ATTENTION_REGISTRY)
ORDER_INVARIANT = sorted(set(NAMES) - {"visual", "pooling"})


def _multihead(
    name: str,
    attn_dropout: float,
    res_dropout: float,
    causal: bool,
    heads: int,
    skip_output_projection: bool = False,
    use_separate_proj_weights: bool = True,
) -> MultiHeadDispatch:
    config = {
        "name": name,
        "dropout": attn_dropout,
        "causal": causal,
        "seq_len": SEQ,
        "window_size": SEQ // 8 + 1,
        "attention_query_mask": torch.rand((SEQ, 1)) < _DENSITY_THRESHOLD * 0.9,
        "dim_model": MODEL,
        "num_heads": heads,
        "dim_head": MODEL / heads,
        "num_rules": 2,
        "r": 0.5,
        "layout": torch.eye(SEQ // 16, SEQ // 16, dtype=torch.long),
        "block_size": 16,
    }
    if skip_output_projection:
        config["out_proj"] = lambda x: x
    return MultiHeadDispatch(
        seq_len=SEQ,
        dim_model=MODEL,
        residual_dropout=res_dropout,
        num_heads=heads,
        attention=build_attention(config),
        use_separate_proj_weight=use_separate_proj_weights,
    )


def _square(mha: MultiHeadDispatch) -> bool:
    return not mha.attention.requires_squared_context or math.isqrt(SEQ) ** 2 == SEQ


def _sample(grid: list[tuple], step: int) -> list[tuple]:
    """One in ``step`` combinations, drawn with a fixed seed (the same cases every run)."""
    return random.Random(0).sample(grid, len(grid) // step)


@pytest.mark.parametrize(
    ("attn_dropout", "residual_dropout", "causal", "heads"),
    _sample(list(itertools.product([0.0, 0.3], [0.0, 0.1], [True, False], [1, 4])), 4),
)
@pytest.mark.parametrize("name", ORDER_INVARIANT)
def test_order_invariance(
    name: str, heads: int, attn_dropout: float, residual_dropout: float, causal: bool
) -> None:
    torch.manual_seed(42)
    mha = _multihead(name, attn_dropout, residual_dropout, causal, heads, use_separate_proj_weights=False)
    seqs = [SEQ] if mha.attention.requires_same_k_q_dimensions else [SEQ, SEQ // 2]
    for seq in seqs:
        inputs = torch.rand(BATCH, seq, MODEL)
        shuffled = inputs[:, torch.randperm(seq), :].clone()
        assert mha(inputs, inputs, inputs).shape == (BATCH, seq, MODEL)
        assert mha(shuffled, inputs, inputs).shape == (BATCH, seq, MODEL)
        if name == "scaled_dot_product" and not causal and attn_dropout == residual_dropout == 0.0:
            # Exact attention does not depend on the order of the keys and values (shuffled together).
            perm = torch.randperm(seq)
            keys = inputs[:, perm, :]
            torch.testing.assert_close(
                mha(inputs, inputs, inputs), mha(inputs, keys, keys), atol=1e-5, rtol=1e-4
            )
        if attn_dropout > 0:
            assert (mha(inputs, shuffled, inputs) != mha(inputs, shuffled, inputs)).any()


@pytest.mark.parametrize("heads", [1, 4])
def test_kqv_ordering(heads: int) -> None:
    mha = _multihead("scaled_dot_product", 0.0, 0.0, False, heads)
    half = MODEL // 2
    q = torch.cat((torch.rand(1, half), torch.zeros(1, half)), dim=1).expand(BATCH, SEQ, MODEL)
    k = torch.cat((torch.zeros(1, half), torch.rand(1, half)), dim=1).expand(BATCH, SEQ, MODEL)
    v = torch.rand(BATCH, SEQ, MODEL)
    res = mha(query=q, key=k, value=v)
    for i in range(BATCH):
        assert torch.allclose(res[i], res[i, 0].unsqueeze(-2))
    assert not torch.allclose(res[0], res[1])
    flipped = mha(query=v, key=k, value=q)
    assert torch.allclose(flipped[0], flipped[1])


@pytest.mark.parametrize("heads", [1, 4])
def test_different_seqlen(heads: int) -> None:
    mha = _multihead("scaled_dot_product", 0.0, 0.0, False, heads)
    long = mha(torch.rand(BATCH, SEQ, MODEL), torch.rand(BATCH, SEQ, MODEL), torch.rand(BATCH, SEQ, MODEL))
    short = mha(*(torch.rand(BATCH, SEQ // 2, MODEL) for _ in range(3)))
    assert long.shape != short.shape


@pytest.mark.parametrize("proj_bias", [False, True])
@pytest.mark.parametrize("same_sizes", [False, True])
@pytest.mark.parametrize("same_settings", [False, True])
def test_inproj(proj_bias: bool, same_sizes: bool, same_settings: bool) -> None:
    attention = build_attention(
        {
            "name": "scaled_dot_product",
            "dropout": 0.1,
            "causal": False,
            "seq_len": SEQ,
            "window_size": SEQ // 8 + 1,
            "num_heads": 1,
            "dim_head": MODEL,
        }
    )
    params = InputProjectionConfig(MODEL, MODEL, proj_bias)
    if same_settings:
        in_proj, out_features = InputProjection(params, None, None), MODEL
    else:
        out_features = MODEL if same_sizes else MODEL // 2
        flip = InputProjectionConfig(MODEL, out_features, proj_bias)
        in_proj = InputProjection(flip, flip, params)
    mha = MultiHeadDispatch(
        seq_len=SEQ,
        dim_model=MODEL,
        residual_dropout=0.1,
        num_heads=1,
        attention=attention,
        in_proj_container=in_proj,
        dim_key=out_features,
        dim_value=MODEL,
    )
    q, k, v = (torch.rand(BATCH, SEQ, MODEL) for _ in range(3))
    assert mha(query=q, key=k, value=v).shape == (BATCH, SEQ, MODEL)


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("name", NAMES)
def test_different_kq_dimensions(name: str, heads: int) -> None:
    mha = _multihead(name, 0.0, 0.0, False, heads)
    if mha.attention.requires_same_k_q_dimensions:
        with pytest.raises(AssertionError):
            mha(
                torch.rand(BATCH, SEQ // 2, MODEL),
                torch.rand(BATCH, SEQ, MODEL),
                torch.rand(BATCH, SEQ, MODEL),
            )
        return
    res = mha(
        query=torch.rand(BATCH, SEQ // 2, MODEL),
        key=torch.rand(BATCH, SEQ, MODEL),
        value=torch.rand(BATCH, SEQ, MODEL),
    )
    assert res.shape == (BATCH, SEQ // 2, MODEL)


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("batch_sizes", [(1, BATCH, 1), (BATCH, 1, BATCH)])
def test_broadcast_batch_dimension(name: str, heads: int, batch_sizes: tuple[int, int, int]) -> None:
    mha = _multihead(name, 0.0, 0.0, False, heads)
    if not _square(mha):
        with pytest.raises(AssertionError):
            mha(*(torch.rand(b, SEQ, MODEL) for b in batch_sizes))
        return
    res = mha(*(torch.rand(b, SEQ, MODEL) for b in batch_sizes))
    assert res.shape == (BATCH, SEQ, MODEL)


@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("name", ["scaled_dot_product", "favor"])
def test_causal(name: str, heads: int) -> None:
    """With ``causal``, changing the tokens after position i leaves the outputs up to i unchanged."""
    torch.manual_seed(42)
    mha = _multihead(name, 0.0, 0.0, True, heads)
    x = torch.rand(1, SEQ, MODEL)
    changed = x.clone()
    changed[:, SEQ // 2 :] = torch.rand(1, SEQ - SEQ // 2, MODEL)
    before, after = mha(x, x, x), mha(changed, changed, changed)
    torch.testing.assert_close(before[:, : SEQ // 2], after[:, : SEQ // 2])
    assert not torch.allclose(before[:, SEQ // 2 :], after[:, SEQ // 2 :])


@pytest.mark.parametrize("attn_dropout", [0.0])
@pytest.mark.parametrize("name", sorted(set(NAMES) - {"favor", "global", "local", "random"}))
def test_torch_script_ability(name: str, attn_dropout: float) -> None:
    mha = _multihead(name, attn_dropout, 0.0, False, 2)
    if not _square(mha):
        pytest.skip(f"{name} needs a square number of tokens")
    torch.manual_seed(42)
    with warnings.catch_warnings():  # shape checks become constants in the trace, as they should
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(
            mha, tuple(torch.rand(BATCH, SEQ, MODEL) for _ in range(3)), check_trace=False
        )
    q, k, v = (torch.rand(BATCH, SEQ, MODEL) for _ in range(3))
    torch.manual_seed(42)
    eager = mha(query=q, key=k, value=v)
    torch.manual_seed(42)
    assert torch.allclose(eager, traced(q, k, v))


@pytest.mark.parametrize(
    ("attn_dropout", "causal", "q_compose", "dim_selection", "qk_rule", "nonlinear"),
    _sample(
        list(
            itertools.product(
                [0.0, 0.3], [True, False], [False, True], [16, None], [True, False], [True, False]
            )
        ),
        4,
    ),
)
def test_compositional(
    attn_dropout: float,
    causal: bool,
    q_compose: bool,
    dim_selection: int | None,
    qk_rule: bool,
    nonlinear: bool,
) -> None:
    torch.manual_seed(42)
    seq, model = 16, 32
    attention = build_attention(
        {
            "name": "compositional",
            "dropout": attn_dropout,
            "causal": causal,
            "seq_len": seq,
            "dim_model": model,
            "num_heads": 4,
            "num_rules": 2,
            "q_compose": q_compose,
            "rules": 4,
            "dim_selection": dim_selection,
            "qk_rule": qk_rule,
            "nonlinear": nonlinear,
        }
    )
    mha = MultiHeadDispatch(
        seq_len=seq, dim_model=model, num_heads=4, attention=attention, residual_dropout=0.0
    )
    for length in (seq, seq // 2):
        inputs = torch.rand(BATCH, length, model)
        shuffle = torch.randperm(length)
        shuffled = inputs[:, shuffle, :].clone()
        results = mha(inputs, inputs, inputs)
        if attn_dropout == 0.0 and not causal:
            # Without causality each output depends on its own query and the set of keys: a permutation
            # of the tokens permutes the outputs.
            torch.testing.assert_close(
                results[:, shuffle, :], mha(shuffled, shuffled, shuffled), atol=1e-5, rtol=1e-4
            )
        if attn_dropout > 0:
            assert (mha(inputs, shuffled, inputs) != mha(inputs, shuffled, inputs)).any()
