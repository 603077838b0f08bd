"""xformers' approximate mechanisms against exact attention, and its component registries (ported from
xformers' test_favor, test_nystrom_attention, test_ortho_attention, test_global_attention,
test_feedforward, test_embedding, test_residual and test_rotary_embeddings), on CPU at smaller sizes
where xformers' sizes (900 tokens) would take minutes here."""

from __future__ import annotations

import math
import random

import pytest
import torch

from brickwork.xformers.components import (
    Activation,
    NormalizationType,
    PatchEmbeddingConfig,
    PreNorm,
    build_patch_embedding,
)
from brickwork.xformers.components.attention import (
    FavorAttention,
    GlobalAttention,
    NystromAttention,
    OrthoFormerAttention,
    ScaledDotProduct,
)
from brickwork.xformers.components.attention.feature_maps import (
    FeatureMapType,
    NormDistribution,
    SMHyperbolic,
    SMOrf,
    SMReg,
)
from brickwork.xformers.components.attention.utils import maybe_merge_masks
from brickwork.xformers.components.feedforward import FEEDFORWARD_REGISTRY, build_feedforward
from brickwork.xformers.components.positional_embedding import (
    POSITION_EMBEDDING_REGISTRY,
    RotaryEmbedding,
    build_positional_embedding,
)
from brickwork.xformers.components.positional_embedding.rotary import apply_rotary_pos_emb, rotate_half


@pytest.mark.parametrize("features", [SMOrf, SMHyperbolic, SMReg])
def test_random_matrix(features: type) -> None:
    torch.random.manual_seed(0)
    for _ in range(20):
        q = features._get_random_ortho_matrix(
            1, 10, device=torch.device("cpu"), norm_distribution=NormDistribution.Xi
        )
        q = q.squeeze(0)
        unit = q / q.norm(dim=1, keepdim=True)
        torch.testing.assert_close(unit @ unit.T, torch.eye(10), atol=1e-5, rtol=1e-5)  # orthogonal rows
        assert abs(q.norm(dim=1).mean().item() - math.sqrt(10)) < 1.0


def _rng_data() -> torch.Tensor:
    return torch.randn(2, 20, 10)  # [B*H, T, D]


def test_feature_map_shape() -> None:
    batch = _rng_data()
    att = FavorAttention(dropout=0.0, dim_features=1000, feature_map_type=FeatureMapType.SMOrf)
    _ = att(batch, batch, batch)
    assert att.feature_map.features.shape == (batch.shape[-1], 1000)


@pytest.mark.parametrize("should_redraw", [True, False])
def test_feature_map_redraw(should_redraw: bool) -> None:
    batch = _rng_data()
    att = FavorAttention(
        dropout=0.0,
        dim_features=1000,
        feature_map_type=FeatureMapType.SMOrf,
        iter_before_redraw=1 if should_redraw else 100,
    )
    v0, f0 = att(batch, batch, batch), att.feature_map.features
    v1, f1 = att(batch, batch, batch), att.feature_map.features
    assert should_redraw != torch.allclose(v0, v1)
    assert should_redraw != torch.allclose(f0, f1)


@pytest.mark.parametrize("feature", ["sm_orf", "sm_hyp", "sm_reg"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("normalize_inputs", [True, False])
def test_favor_approximation_accuracy(feature: str, causal: bool, normalize_inputs: bool) -> None:
    torch.random.manual_seed(0)
    query, key, value = _rng_data(), _rng_data(), _rng_data()
    for x in (query, key, value):
        x.requires_grad = True
    exact = ScaledDotProduct(dropout=0.0, causal=causal)(query, key, value)
    approx = FavorAttention(
        dropout=0.0,
        causal=causal,
        dim_head=10,
        feature_map_type=FeatureMapType(feature),
        normalize_inputs=normalize_inputs,
    )(query, key, value)
    mismatch = torch.mean((exact - approx) ** 2).item()
    assert mismatch < (0.6 if causal else 0.23)
    approx.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (query, key, value))


B, S, D, HEADS = 2, 900, 40, 2  # Nyström at xformers' sizes
S_ORTHO = 300


def _sdp(a: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    return ScaledDotProduct(dropout=0.0)(a, a, a, att_mask=mask)


@pytest.mark.parametrize("pinverse_original_init", [True, False])
@pytest.mark.parametrize("use_razavi_pinverse", [True, False])
@pytest.mark.parametrize("num_landmarks", [30, 33, 905])
def test_nystrom_attention_close_to_sdp(
    pinverse_original_init: bool, use_razavi_pinverse: bool, num_landmarks: int
) -> None:
    torch.random.manual_seed(42)
    random.seed(42)
    a = torch.rand(B, S, D)
    nystrom = NystromAttention(
        dropout=0.0,
        num_landmarks=num_landmarks,
        num_heads=HEADS,
        pinverse_original_init=pinverse_original_init,
        use_razavi_pinverse=use_razavi_pinverse,
    )
    assert torch.allclose(nystrom(a, a, a, att_mask=None), _sdp(a), rtol=0.005, atol=1e-2)


def test_nystrom_masks() -> None:
    torch.random.manual_seed(42)
    a = torch.rand(B, S, D)
    nystrom = NystromAttention(dropout=0.0, num_landmarks=30, num_heads=HEADS, pinverse_original_init=True)
    # An attention mask is ignored (with a warning), as xformers did.
    ignored = nystrom(a, a, a, att_mask=torch.randint(0, 2, (S, S)).bool())
    assert torch.allclose(ignored, _sdp(a), rtol=0.005, atol=1e-2)
    padding = torch.rand((B // HEADS, S)) > 0.1
    mask = maybe_merge_masks(None, padding, batch_size=B // HEADS, src_len=S, num_heads=HEADS)
    assert torch.allclose(nystrom(a, a, a, key_padding_mask=padding), _sdp(a, mask), rtol=0.1, atol=0.5)
    with pytest.raises(AssertionError):
        nystrom(a, a, a, key_padding_mask=torch.randint(0, 2, (S, B)).bool())


@pytest.mark.parametrize("landmark_selection", ["orthogonal", "kmeans", "kmeans_spherical", "random"])
@pytest.mark.parametrize("num_landmarks", [30, 33, 305])
@pytest.mark.parametrize("subsample_fraction", [1.0, 0.3])
def test_ortho_attention(landmark_selection: str, num_landmarks: int, subsample_fraction: float) -> None:
    torch.random.manual_seed(42)
    a = torch.rand(4, S_ORTHO, 32)
    ortho = OrthoFormerAttention(
        dropout=0.0,
        num_landmarks=num_landmarks,
        num_heads=HEADS,
        landmark_selection=landmark_selection,
        subsample_fraction=subsample_fraction,
    )
    assert torch.allclose(ortho(a, a, a, att_mask=None), _sdp(a), rtol=0.02, atol=1e-1)
    ignored = ortho(a, a, a, att_mask=torch.randint(0, 2, (S_ORTHO, S_ORTHO)).bool())
    assert torch.allclose(ignored, _sdp(a), rtol=0.02, atol=1e-1)


@pytest.mark.parametrize("ratio", [0.02, 0.5, 1.0])
def test_global_attention(ratio: float) -> None:
    torch.manual_seed(42)
    b, s, d = 2, 90, 40
    a = torch.rand(b, s, d)
    query_mask = torch.rand((s, 1)) < ratio
    out = GlobalAttention(dropout=0.0, causal=False, max_seq_len=s, attention_query_mask=query_mask)(a, a, a)
    rows = query_mask[:, 0]
    # Global queries see every key: exact attention on those rows.
    assert torch.allclose(out[:, rows, :], _sdp(a)[:, rows, :])
    # The others see the global tokens and themselves.
    keep = rows[None, :] | rows[:, None] | torch.eye(s, dtype=torch.bool)
    torch.testing.assert_close(out, _sdp(a, keep))


@pytest.mark.parametrize("name", sorted(FEEDFORWARD_REGISTRY))
@pytest.mark.parametrize("activation", [a.value for a in Activation])
def test_feedforward(name: str, activation: str) -> None:
    ffw = build_feedforward(
        {
            "name": name,
            "dim_model": 32,
            "dropout": 0.5,
            "activation": activation,
            "hidden_layer_multiplier": 4,
            "number_of_experts": 4,
            "gate": "top_2",
        }
    )
    assert not ffw.requires_cuda
    assert ffw(torch.rand(2, 64, 32)).shape == (2, 64, 32)


@pytest.mark.parametrize("name", sorted(POSITION_EMBEDDING_REGISTRY))
@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_position_embedding_dimensions(name: str, dropout: float) -> None:
    encoding = build_positional_embedding(
        {"name": name, "dim_model": 64, "vocab_size": 32, "dropout": dropout, "seq_len": 128}
    )
    assert encoding((torch.rand(4, 128) * 10).abs().int()).shape == (4, 128, 64)


def test_patch_embedding() -> None:
    patch_emb = build_patch_embedding(
        PatchEmbeddingConfig(in_channels=3, out_channels=64, kernel_size=7, stride=4, padding=2)
    )
    assert patch_emb(torch.rand(4, 32 * 32, 3)).shape[-1] == 64
    assert patch_emb(torch.rand(4, 3, 32, 32)).shape == (4, 64, 64)


class Passthrough(torch.nn.Module):
    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return args


@pytest.mark.parametrize("normalization", [n.value for n in NormalizationType])
def test_pre_norm(normalization: str) -> None:
    x = torch.rand((3, 3), requires_grad=True)
    outputs = PreNorm(d_norm=3, sublayer=Passthrough(), normalization=normalization, use_triton=False)(
        inputs=[x, x, x]
    )
    assert id(outputs[0]) == id(outputs[1])
    expected = x if normalization == "skip" else torch.nn.functional.layer_norm(x, (3,))
    torch.testing.assert_close(outputs[0], expected)
    torch.sum(outputs[0]).backward()


def test_rotary_helpers() -> None:
    tens = torch.tensor([[0, 1, 2, 3], [3, 1, 2, 0], [0, 1, 0, 1], [1, 0, 1, 0]])
    assert torch.equal(
        rotate_half(tens), torch.tensor([[-2, -3, 0, 1], [-2, 0, 3, 1], [0, -1, 0, 1], [-1, 0, 1, 0]])
    )
    q = 3 * torch.ones((2, 2, 3, 4))
    applied = apply_rotary_pos_emb(q, torch.ones((1, 1, 4, 4)), torch.ones((1, 1, 4, 4)))
    assert torch.equal(applied, torch.cat((torch.zeros((2, 2, 3, 2)), 6 * torch.ones((2, 2, 3, 2))), dim=-1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rotary_embeddings(dtype: torch.dtype) -> None:
    rotary = RotaryEmbedding(32)
    q = torch.ones((2, 2, 32, 32), dtype=dtype)
    q_rot, k_rot = rotary(q, q.clone())
    assert q_rot.dtype == k_rot.dtype == dtype
    att = torch.einsum("bhne,bhme->bhnm", q.float(), q.float())
    att_rot = torch.einsum("bhne,bhme->bhnm", q_rot.float(), k_rot.float())
    assert torch.allclose(torch.diag(att[0, 0]), torch.diag(att_rot[0, 0]), rtol=0.1)
    assert torch.all(att_rot - torch.diag(att_rot[0, 0]).max() <= 1e-4)  # the diagonal dominates
    # Rotations are relative: q at position i against k at position j depends on i - j only.
    torch.testing.assert_close(att_rot[0, 0, 3, 1], att_rot[0, 0, 12, 10], atol=1e-2, rtol=1e-2)
    rotary(q[:, :, :-16, :], q)
