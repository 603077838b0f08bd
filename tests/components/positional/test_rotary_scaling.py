"""Rotary context-extension scaling against formulas written here and against HF's rope utilities."""

from __future__ import annotations

import math

import pytest
import torch

from brickwork.components.positional import RotaryEmbedding

DIM, BASE = 32, 10000.0


def plain_freqs(dim: int = DIM, base: float = BASE) -> list[float]:
    return [base ** (-2 * i / dim) for i in range(dim // 2)]


def assert_freqs(rope: RotaryEmbedding, expected: list[float]) -> None:
    torch.testing.assert_close(rope.inv_freq, torch.tensor(expected, dtype=torch.float32), rtol=1e-6, atol=0)


def test_linear_divides_every_frequency_by_the_factor() -> None:
    rope = RotaryEmbedding(DIM, scaling={"type": "linear", "factor": 4.0})
    assert_freqs(rope, [f / 4 for f in plain_freqs()])
    # Position interpolation: position 4p under the scaled embedding is position p unscaled.
    x = torch.randn(1, 1, 3, DIM, dtype=torch.float64)
    plain = RotaryEmbedding(DIM)
    torch.testing.assert_close(rope.rotate(x[:, :, :1], offset=8), plain.rotate(x[:, :, :1], offset=2))


def test_ntk_rescales_the_base() -> None:
    rope = RotaryEmbedding(DIM, scaling={"type": "ntk", "factor": 8.0})
    new_base = BASE * 8.0 ** (DIM / (DIM - 2))
    assert_freqs(rope, plain_freqs(base=new_base))
    # The highest frequency is untouched and the lowest is interpolated by exactly the factor.
    assert rope.inv_freq[0].item() == pytest.approx(1.0)
    assert (new_base ** (-(DIM - 2) / DIM)) == pytest.approx(BASE ** (-(DIM - 2) / DIM) / 8.0)


def yarn_reference(
    factor: float, original: int, beta_fast: float, beta_slow: float, truncate: bool
) -> list[float]:
    """YaRN "NTK-by-parts" (Peng et al. 2023, and the authors' reference code): dimension d turns
    r(d) = original / wavelength(d) times over the original context; dims turning more than beta_fast
    times keep their frequency, fewer than beta_slow are divided by the factor, with a ramp linear in d
    between the two boundary dimensions."""

    def boundary(rotations: float) -> float:
        return DIM * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(BASE))

    low, high = boundary(beta_fast), boundary(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, DIM - 1)
    out = []
    for i, theta in enumerate(plain_freqs()):
        gamma = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: extrapolate, 1: interpolate
        out.append((1 - gamma) * theta + gamma * theta / factor)
    return out


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize(
    ("factor", "original", "beta_fast", "beta_slow"), [(4.0, 256, 32.0, 1.0), (16.0, 2048, 16, 2)]
)
def test_yarn_frequencies(factor: float, original: int, beta_fast: float, beta_slow: float, truncate: bool):
    scaling = {"type": "yarn", "factor": factor, "original_max_position_embeddings": original}
    scaling.update(beta_fast=beta_fast, beta_slow=beta_slow, truncate=truncate)
    rope = RotaryEmbedding(DIM, scaling=scaling)
    assert_freqs(rope, yarn_reference(factor, original, beta_fast, beta_slow, truncate))
    if not truncate:
        # The paper's piecewise rule outside the ramp: r > beta_fast keeps theta, r < beta_slow gives
        # theta / s.
        for theta, got in zip(plain_freqs(), rope.inv_freq.tolist()):
            r = original * theta / (2 * math.pi)
            if r > beta_fast:
                assert got == pytest.approx(theta, rel=1e-6)
            elif r < beta_slow:
                assert got == pytest.approx(theta / factor, rel=1e-6)
            else:
                assert theta / factor <= got <= theta


@pytest.mark.parametrize(("attention_factor", "expected"), [(None, 0.1 * math.log(8.0) + 1), (1.5, 1.5)])
def test_yarn_temperature_scales_cos_and_sin(attention_factor: float | None, expected: float) -> None:
    scaling = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64}
    if attention_factor is not None:
        scaling["attention_factor"] = attention_factor
    rope = RotaryEmbedding(DIM, scaling=scaling)
    assert rope.attention_factor == pytest.approx(expected)
    cos, sin = rope.cos_sin(5, 3, torch.device("cpu"), torch.float64)
    angles = torch.arange(5, 8, dtype=torch.float64)[:, None] * rope.inv_freq.double()[None, :]
    torch.testing.assert_close(cos, expected * angles.cos(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sin, expected * angles.sin(), rtol=1e-6, atol=1e-6)
    # Both q and k carry the factor, so their product carries its square (the paper's 1/t = factor^2).
    q = torch.randn(1, 1, 1, DIM, dtype=torch.float64)
    q_out, k_out = rope(q, q, offset=3)
    assert (q_out * k_out).sum().item() == pytest.approx(expected**2 * (q * q).sum().item())


def test_llama3_frequencies() -> None:
    scaling = {"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 512}
    rope = RotaryEmbedding(DIM, base=500000.0, scaling=scaling)
    expected = []
    for theta in plain_freqs(base=500000.0):
        wavelength = 2 * math.pi / theta
        if wavelength < 512 / 4.0:  # high frequency: kept
            expected.append(theta)
        elif wavelength > 512 / 1.0:  # low frequency: interpolated
            expected.append(theta / 8.0)
        else:
            smooth = (512 / wavelength - 1.0) / (4.0 - 1.0)
            expected.append((1 - smooth) * theta / 8.0 + smooth * theta)
    assert_freqs(rope, expected)
    kept = [e == t for e, t in zip(expected, plain_freqs(base=500000.0))]
    assert any(kept) and not all(kept)


HF_CASES = [
    ({"type": "linear", "factor": 3.0}, {"rope_type": "linear", "factor": 3.0}, 1.0),
    (
        {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 24.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 24.0},
        1.0,
    ),
    (
        {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64},
        0.5,
    ),
    (
        {"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 256, "high_freq_factor": 2.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "original_max_position_embeddings": 256,
            "low_freq_factor": 1.0,
            "high_freq_factor": 2.0,
        },
        1.0,
    ),
]


@pytest.mark.parametrize(("ours", "theirs", "fraction"), HF_CASES)
def test_matches_hf_rope_init_functions(ours: dict, theirs: dict, fraction: float) -> None:
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    original = theirs.get("original_max_position_embeddings", 64)
    config = LlamaConfig(
        hidden_size=4 * DIM,
        num_attention_heads=4,
        head_dim=DIM,
        max_position_embeddings=int(original * theirs["factor"]),
        rope_parameters={**theirs, "rope_theta": BASE, "partial_rotary_factor": fraction},
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[theirs["rope_type"]](config, "cpu")
    rope = RotaryEmbedding(DIM, fraction=fraction, scaling=ours)
    torch.testing.assert_close(rope.inv_freq, inv_freq.float(), rtol=1e-6, atol=0)
    assert rope.attention_factor == pytest.approx(attention_factor)
