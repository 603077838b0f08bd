"""Rotary embedding against the closed-form rotation, the relative-position property, and HF."""

from __future__ import annotations

import math

import pytest
import torch

from brickwork.components.positional import RotaryEmbedding
from brickwork.errors import ConfigError


def closed_form(x: torch.Tensor, offset: int, base: float, rotated: int, interleaved: bool) -> torch.Tensor:
    """x ``[B, H, T, D]`` float64, rotated pair by pair with explicit angles ``p * base^(-2i / r)``."""
    out = x.clone()
    for t in range(x.shape[2]):
        for i in range(rotated // 2):
            angle = (offset + t) * base ** (-2 * i / rotated)
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + rotated // 2)
            xa, xb = x[:, :, t, a], x[:, :, t, b]
            out[:, :, t, a] = xa * math.cos(angle) - xb * math.sin(angle)
            out[:, :, t, b] = xb * math.cos(angle) + xa * math.sin(angle)
    return out


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("fraction", "rotated"), [(1.0, 8), (0.5, 4), (0.25, 2)])
@pytest.mark.parametrize("offset", [0, 5])
def test_matches_closed_form_rotation(interleaved: bool, fraction: float, rotated: int, offset: int) -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, base=100.0, fraction=fraction, interleaved=interleaved)
    assert rope.rotary_dim == rotated
    q = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    k = torch.randn(2, 1, 4, 8, dtype=torch.float64)
    q_out, k_out = rope(q, k, offset=offset)
    torch.testing.assert_close(q_out, closed_form(q, offset, 100.0, rotated, interleaved))
    torch.testing.assert_close(k_out, closed_form(k, offset, 100.0, rotated, interleaved))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_scores_depend_only_on_relative_position(interleaved: bool, fraction: float) -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, fraction=fraction, interleaved=interleaved, max_seq_len=8)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)

    def score(i: int, j: int) -> float:
        qi = rope.rotate(q.view(1, 16), offset=i)
        kj = rope.rotate(k.view(1, 16), offset=j)
        return (qi * kj).sum().item()

    for i, j in [(0, 0), (3, 1), (2, 7), (10, 4)]:
        for shift in (1, 13, 500):  # also past max_seq_len, beyond the cache
            assert score(i + shift, j + shift) == pytest.approx(score(i, j), rel=1e-9, abs=1e-9)
    assert score(3, 1) != pytest.approx(score(4, 1))


def test_fp32_cache_and_positions_past_it_agree_with_fp64() -> None:
    rope = RotaryEmbedding(8, max_seq_len=6)
    x = torch.randn(1, 2, 10, 8, dtype=torch.float64)
    expected = rope.rotate(x)
    for offset, length in [(0, 6), (2, 4), (4, 6), (6, 4)]:
        got = rope.rotate(x[:, :, offset : offset + length].float(), offset=offset)
        torch.testing.assert_close(
            got, expected[:, :, offset : offset + length].float(), rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_rotate_in_fp32_and_cast_back(dtype: torch.dtype) -> None:
    rope = RotaryEmbedding(8)
    q = torch.randn(1, 2, 5, 8).to(dtype)
    q_out, k_out = rope(q, q, offset=100)
    assert q_out.dtype == dtype and k_out.dtype == dtype
    expected = closed_form(q.double(), 100, 10000.0, 8, False).to(dtype)
    torch.testing.assert_close(q_out, expected)


def test_casting_the_module_keeps_fp32_frequencies() -> None:
    rope = RotaryEmbedding(8, max_seq_len=4).to(torch.bfloat16)
    assert rope.inv_freq.dtype == torch.float32 and rope.cos_cached.dtype == torch.float32
    torch.testing.assert_close(rope.inv_freq, 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8))


def test_materialising_from_meta_device_recomputes_buffers() -> None:
    with torch.device("meta"):
        rope = RotaryEmbedding(8, max_seq_len=4)
    rope.to_empty(device="cpu")
    fresh = RotaryEmbedding(8, max_seq_len=4)
    torch.testing.assert_close(rope.inv_freq, fresh.inv_freq)
    torch.testing.assert_close(rope.cos_cached, fresh.cos_cached)


def test_bad_shapes_raise_value_error() -> None:
    rope = RotaryEmbedding(8)
    with pytest.raises(ValueError, match=r"dim_head=8.*\(1, 2, 3, 6\)"):
        rope(torch.zeros(1, 2, 3, 6), torch.zeros(1, 2, 3, 8))
    with pytest.raises(ValueError, match=r"k must be \[B, heads, T, dim_head\]"):
        rope(torch.zeros(1, 2, 3, 8), torch.zeros(3, 8))


def test_matches_hf_llama_half_split_rotation() -> None:
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    rope = RotaryEmbedding(16)
    q, k = torch.randn(2, 4, 6, 16), torch.randn(2, 2, 6, 16)
    positions = torch.arange(3, 9, dtype=torch.float32)
    freqs = positions[:, None] * rope.inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[None]
    hf_q, hf_k = llama.apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
    q_out, k_out = rope(q, k, offset=3)
    torch.testing.assert_close(q_out, hf_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(k_out, hf_k, rtol=1e-5, atol=1e-5)


def test_matches_hf_gptj_interleaved_partial_rotation() -> None:
    gptj = pytest.importorskip("transformers.models.gptj.modeling_gptj")
    rope = RotaryEmbedding(16, fraction=0.5, interleaved=True)
    x = torch.randn(2, 3, 6, 16)  # [B, H, T, D]
    sincos = gptj.create_sinusoidal_positions(10, 8)[4:10][None]  # positions 4..9
    sin, cos = sincos.chunk(2, dim=-1)
    hf_rot = gptj.apply_rotary_pos_emb(x[..., :8].transpose(1, 2), sin, cos).transpose(1, 2)
    expected = torch.cat((hf_rot, x[..., 8:]), dim=-1)
    torch.testing.assert_close(rope.rotate(x, offset=4), expected, rtol=1e-5, atol=1e-5)


def test_scaling_options_are_checked_without_touching_the_users_dict() -> None:
    scaling = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    rope = RotaryEmbedding(8, scaling=scaling)
    assert scaling == {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert rope.scaling["beta_fast"] == 32.0 and rope.scaling["beta_slow"] == 1.0
    yarn, llama3 = {"type": "yarn", "factor": 2.0}, {"type": "llama3", "factor": 8.0}
    cases = [
        ({"type": "lineer", "factor": 2.0}, r"scaling\.type.*did you mean 'linear'"),
        ({"type": "linear", "factor": 2.0, "beta": 1}, r"scaling\.beta.*allowed: factor, type"),
        ({"type": "yarn", "factor": 2.0}, r"scaling\.original_max_position_embeddings"),
        ({"type": "linear", "factor": 0.5}, r"scaling\.factor"),
        ({**yarn, "original_max_position_embeddings": 8, "beta_fast": 0.5}, r"scaling\.beta_fast"),
        ({**llama3, "original_max_position_embeddings": 8, "high_freq_factor": 1.0}, r"scaling\.high_freq"),
        ("linear", r"^scaling: must be a mapping"),
    ]
    for bad, pattern in cases:
        with pytest.raises(ConfigError, match=pattern):
            RotaryEmbedding(8, scaling=bad)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotation_keeps_the_projection_layout(interleaved: bool, dtype: torch.dtype) -> None:
    # q as attention makes it, [B, T, H, D] in memory viewed as [B, H, T, D]: the rotated q keeps that
    # layout, so attention's output comes back as [B, T, H, D] and reaches out_proj without a copy.
    q = torch.randn(2, 5, 3, 8, dtype=dtype).transpose(1, 2)
    rotated = RotaryEmbedding(8, interleaved=interleaved).rotate(q, offset=3)
    assert rotated.stride() == q.stride()
    assert rotated.transpose(1, 2).reshape(2, 5, 24).data_ptr() == rotated.data_ptr()


def test_layers_with_the_same_options_share_one_pair_of_tables() -> None:
    from brickwork.factory import build_model

    spec = {
        "model": "decoder_lm", "vocab_size": 32, "dim_model": 16, "max_seq_len": 64, "position": "rotary",
        "decoder": {"num_layers": 3, "block": {"attention": {"num_heads": 2}}},
    }  # fmt: skip
    model = build_model(spec)
    tables = [m for m in model.modules() if isinstance(m, RotaryEmbedding)]
    assert len(tables) == 3
    assert len({m.cos_cached.data_ptr() for m in tables}) == 1
    assert len({m.sin_cached.data_ptr() for m in tables}) == 1
    model.to(torch.bfloat16)  # a cast rebuilds the tables in fp32, still shared
    assert {m.cos_cached.dtype for m in tables} == {torch.float32}
    assert len({m.cos_cached.data_ptr() for m in tables}) == 1
    other = RotaryEmbedding(8, base=500.0, max_seq_len=64)
    assert other.cos_cached.data_ptr() != tables[0].cos_cached.data_ptr()
    torch.testing.assert_close(
        other.cos_sin(3, 4, torch.device("cpu"))[0],
        RotaryEmbedding(8, base=500.0)._cos_sin(3, 4, "cpu", torch.float32)[0],
    )
