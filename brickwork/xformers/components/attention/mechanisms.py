"""xformers' registered mechanisms, each running the brickwork mechanism of the same family.

xformers hands a mechanism q ``[B*H, Tq, D]`` (heads folded into the batch) and masks in its own types.
:class:`BrickworkAttention` unfolds that to brickwork's ``[B*H, 1, Tq, D]``, turns the masks into
brickwork's (boolean True = attend, or additive), and runs ``self.mechanism``. Options xformers
accepted but that change nothing here are swallowed as xformers did (``*_, **__``); options that
would change the result and that brickwork does not implement are refused (``ConfigError``) by
``check_mechanism``, as ``from_xformers_config`` refuses them.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

from brickwork.components import attention as bw
from brickwork.components.attention.masks import restrict
from brickwork.components.attention.scaled_dot_product import dense_attention
from brickwork.factory.xformers.stack import check_mechanism
from brickwork.xformers._compat import as_int, require
from brickwork.xformers.components.attention.base import Attention
from brickwork.xformers.components.attention.core import MaskLike, dense_mask, fit_mask
from brickwork.xformers.components.attention.feature_maps import FeatureMapType, FeatureMapView
from brickwork.xformers.components.attention.utils import reshape_key_padding_mask

logger = logging.getLogger("brickwork.xformers")


class BrickworkAttention(Attention):
    """Runs ``self.mechanism`` (a brickwork :class:`AttentionMechanism`) on xformers' tensors and masks."""

    mechanism: nn.Module

    def brickwork_mask(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        att_mask: MaskLike | None,
        key_padding_mask: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """The masks as one brickwork mask broadcastable to ``[N, 1, Tq, Tk]`` (q/k are ``[N, 1, T, D]``)."""
        n, tq, tk = q.shape[0], q.shape[-2], k.shape[-2]
        mask = dense_mask(att_mask)
        if mask is not None:
            mask = fit_mask(mask, n, tq, tk)
            mask = mask.unsqueeze(1) if mask.ndim == 3 else mask
        if key_padding_mask is not None:
            require(
                key_padding_mask.ndim == 2
                and key_padding_mask.shape[-1] == tk
                and n % key_padding_mask.shape[0] == 0,
                f"key_padding_mask of shape {tuple(key_padding_mask.shape)} does not fit [batch, {tk}]",
            )
            keep = reshape_key_padding_mask(key_padding_mask.bool(), n).unsqueeze(1)
            mask = keep if mask is None else restrict(mask, keep, mask.dtype)
        return mask

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        att_mask: MaskLike | None = None,
        key_padding_mask: torch.Tensor | None = None,
        exact: bool = False,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``self.mechanism`` on q ``[B*H, Tq, D]`` (or ``[B, H, Tq, D]``). ``exact`` runs softmax attention
        with the mechanism's dropout instead, under the masks and ``keep`` ``[Tq, Tk]`` (True = attend):
        xformers' result in the cases where the brickwork mechanism computes another."""
        folded = q.ndim == 3
        q4, k4, v4 = (t.unsqueeze(1) for t in (q, k, v)) if folded else (q, k, v)
        if not exact:
            mask = self.brickwork_mask(q4, k4, att_mask, key_padding_mask) if folded else dense_mask(att_mask)
            out = self.mechanism(q4, k4, v4, mask)
        else:
            mask = self.brickwork_mask(q4, k4, att_mask, key_padding_mask)
            mask = mask if keep is None else restrict(mask, keep, q.dtype)
            p = self.mechanism.dropout if self.training else 0.0
            out = dense_attention(q4, k4, v4, mask, dropout_p=p)
        return out.squeeze(1) if folded else out

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        att_mask: MaskLike | None = None,
        key_padding_mask: torch.Tensor | None = None,
        *_: Any,
        **__: Any,
    ) -> torch.Tensor:
        """q ``[B*H, Tq, D]``, k/v ``[B*H, Tk, D]`` -> ``[B*H, Tq, D]``."""
        return self.run(q, k, v, att_mask, key_padding_mask)


class ScaledDotProduct(BrickworkAttention):
    """Exact softmax attention (brickwork ``scaled_dot_product``). Causal attention with Tq != Tk is
    aligned top-left here, as xformers' causal mask was; brickwork aligns it bottom-right."""

    def __init__(
        self,
        dropout: float = 0.0,
        causal: bool = False,
        seq_len: int | None = None,
        to_seq_len: int | None = None,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        self.causal, self.seq_len, self.to_seq_len = causal, seq_len, to_seq_len
        self.mechanism = bw.ScaledDotProduct(dropout=float(dropout), causal=causal)

    def forward(self, q, k, v, att_mask=None, key_padding_mask=None, *_: Any, **__: Any) -> torch.Tensor:  # type: ignore[override]
        """q ``[B*H, Tq, D]``, k/v ``[B*H, Tk, D]`` -> ``[B*H, Tq, D]``."""
        if self.causal and q.shape[-2] != k.shape[-2]:  # xformers' top-left causal mask
            keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            return self.run(q, k, v, att_mask, key_padding_mask, exact=True, keep=keep)
        return self.run(q, k, v, att_mask, key_padding_mask)


class FavorAttention(BrickworkAttention):
    """FAVOR+ (brickwork ``favor``). Built on the first call when ``dim_head`` is not given, as xformers
    drew its features lazily. ``normalize_inputs`` is accepted: brickwork always shifts the exponent by
    its maximum, the constant that cancels in the normalisation, which is what the option did."""

    def __init__(
        self,
        causal: bool = False,
        dropout: float = 0.0,
        dim_features: int | None = None,
        dim_head: int | None = None,
        iter_before_redraw: int | None = None,
        feature_map_type: FeatureMapType | str = FeatureMapType.SMReg,
        normalize_inputs: bool = False,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        self.causal, self.normalize_inputs = causal, normalize_inputs
        feature = FeatureMapType(feature_map_type)
        self._options = {
            "dim_features": as_int(dim_features),
            "iter_before_redraw": iter_before_redraw,
            "feature_map_type": feature.value,
            "causal": causal,
            "dropout": float(dropout),
        }
        self.feature_map_type = feature
        self.mechanism = self._build(as_int(dim_head)) if dim_head is not None else None
        self.supports_attention_mask = False

    def _build(self, dim_head: int) -> nn.Module:
        return bw.FavorAttention(dim_head=dim_head, **self._options)

    @property
    def feature_map(self) -> FeatureMapView | None:
        """The random features (``features`` ``[D, m]``, as xformers stored them); None before a call."""
        return None if self.mechanism is None else FeatureMapView(self.mechanism)

    def forward(self, q, k, v, *_: Any, **__: Any) -> torch.Tensor:  # type: ignore[override]
        """q ``[B*H, Tq, D]``, k/v ``[B*H, Tk, D]`` -> ``[B*H, Tq, D]``."""
        if self.mechanism is None or self.mechanism.dim_head != q.shape[-1]:
            self.mechanism = self._build(q.shape[-1]).to(q.device)
            self.mechanism.train(self.training)
        return self.run(q, k, v)


class GlobalAttention(BrickworkAttention):
    """Global tokens (brickwork ``global`` with ``global_positions``): the queries flagged in the
    ``[T, 1]`` ``attention_query_mask`` see every key and are seen by every query."""

    def __init__(
        self,
        dropout: float = 0.0,
        attention_query_mask: torch.Tensor | None = None,
        causal: bool = False,
        force_sparsity: bool = False,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        require(attention_query_mask is not None, "GlobalAttention needs attention_query_mask")
        require(attention_query_mask.dtype == torch.bool, "A boolean mask is expected")
        require(
            attention_query_mask.ndim == 2
            and attention_query_mask.shape[1] == 1
            and attention_query_mask.shape[0] > 1,
            "A N x 1 query mask is expected",
        )
        positions = attention_query_mask[:, 0].nonzero().flatten().tolist()
        self.causal, self.force_sparsity = causal, force_sparsity
        self.mechanism = bw.GlobalAttention(
            num_global_tokens=None, global_positions=positions, causal=causal, dropout=float(dropout)
        )
        self.requires_same_k_q_dimensions = True
        self.supports_attention_mask = False


class LocalAttention(BrickworkAttention):
    """Sliding window (brickwork ``local``): keys within ``window_size // 2`` of the query."""

    def __init__(
        self,
        dropout: float = 0.0,
        causal: bool = False,
        window_size: int = 5,
        force_sparsity: bool = False,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        self.causal, self.window_size, self.force_sparsity = causal, window_size, force_sparsity
        self.mechanism = bw.LocalAttention(
            window_size=as_int(window_size), causal=causal, dropout=float(dropout)
        )
        self.requires_same_k_q_dimensions = True


class RandomAttention(BrickworkAttention):
    """Random sparsity (brickwork ``random``): each query sees a fixed random fraction ``r`` of the keys.
    The draw is fixed (xformers' ``constant_masking``); a fresh draw per call is refused."""

    def __init__(
        self,
        dropout: float = 0.0,
        causal: bool = False,
        r: float = 0.01,
        constant_masking: bool = True,
        force_sparsity: bool = False,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        check_mechanism("random", {"constant_masking": constant_masking}, "")
        self.causal, self.r = causal, r
        self.mechanism = bw.RandomAttention(r=float(r), causal=causal, dropout=float(dropout))
        self.requires_same_k_q_dimensions = True


class LinformerAttention(BrickworkAttention):
    """Linformer (brickwork ``linformer``): keys and values projected along the sequence to ``k`` rows.
    It has no causal form; xformers ignored ``causal`` for it, and so does this class."""

    def __init__(
        self, dropout: float = 0.0, seq_len: int | None = None, k: int | None = None, *_: Any, **__: Any
    ) -> None:
        super().__init__()
        require(seq_len is not None, "LinformerAttention needs seq_len")
        self.mechanism = bw.LinformerAttention(seq_len=as_int(seq_len), k=as_int(k), dropout=float(dropout))
        self.requires_same_k_q_dimensions = True
        self.supports_attention_mask = False


class NystromAttention(BrickworkAttention):
    """Nyström approximation (brickwork ``nystrom``). Takes a ``[B, Tk]`` key padding mask; an
    ``att_mask`` is ignored with a warning, as xformers did."""

    def __init__(
        self,
        dropout: float = 0.0,
        num_heads: int = 1,
        num_landmarks: int = 64,
        landmark_pooling: nn.Module | None = None,
        causal: bool = False,
        use_razavi_pinverse: bool = True,
        pinverse_original_init: bool = False,
        inv_iterations: int = 6,
        v_skip_connection: nn.Module | None = None,
        conv_kernel_size: int | None = None,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        refused = {"landmark_pooling": landmark_pooling, "v_skip_connection": v_skip_connection,
                   "conv_kernel_size": conv_kernel_size}  # fmt: skip
        check_mechanism("nystrom", refused, "")
        self.causal, self.num_heads = causal, num_heads
        self.mechanism = bw.NystromAttention(
            num_landmarks=as_int(num_landmarks),
            causal=causal,
            inv_iterations=inv_iterations,
            use_razavi_pinverse=use_razavi_pinverse,
            pinverse_original_init=pinverse_original_init,
            dropout=float(dropout),
        )
        self.requires_separate_masks = True
        self.supports_attention_mask = False
        self.supports_key_padding_mask = True

    def forward(self, q, k, v, att_mask=None, key_padding_mask=None, *_: Any, **__: Any) -> torch.Tensor:  # type: ignore[override]
        """q/k/v ``[B*H, T, D]``; ``key_padding_mask`` ``[B, Tk]``, True = keep."""
        if att_mask is not None:
            logger.warning("NystromAttention: att_mask is ignored; pass key_padding_mask instead")
        return self.run(q, k, v, None, key_padding_mask)


class OrthoFormerAttention(BrickworkAttention):
    """Orthoformer (brickwork ``ortho``). With landmarks in play an ``att_mask`` is dropped with a
    warning, as xformers did; it applies only when every key is a landmark."""

    def __init__(
        self,
        dropout: float = 0.0,
        num_landmarks: int = 32,
        subsample_fraction: float = 1.0,
        landmark_selection: Any = "orthogonal",
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        selection = getattr(landmark_selection, "value", landmark_selection)
        self.num_landmarks = as_int(num_landmarks)
        self.mechanism = bw.OrthoformerAttention(
            num_landmarks=self.num_landmarks,
            subsample_fraction=float(subsample_fraction),
            dropout=float(dropout),
            landmark_selection=selection,
        )

    def forward(self, q, k, v, att_mask=None, *_: Any, **__: Any) -> torch.Tensor:  # type: ignore[override]
        """q ``[B*H, Tq, D]``, k/v ``[B*H, Tk, D]`` -> ``[B*H, Tq, D]``."""
        if att_mask is not None and self.num_landmarks != k.shape[-2]:
            logger.warning("OrthoFormerAttention: the attention mask is ignored when landmarks are used")
            att_mask = None
        # A mask left means every key is a landmark: exact attention, as xformers
        return self.run(q, k, v, att_mask, exact=att_mask is not None)


class FourierMix(BrickworkAttention):
    """FNet mixing (brickwork ``fourier_mix``) of the layer input: it reads only the queries."""

    def __init__(self, dropout: float = 0.0, *_: Any, **__: Any) -> None:
        super().__init__()
        self.mechanism = bw.FourierMix(dropout=float(dropout))
        self.supports_attention_mask = False
        self.requires_input_projection = False

    def forward(self, q, *_: Any, **__: Any) -> torch.Tensor:  # type: ignore[override]
        """q ``[B*H, T, D]`` -> ``[B*H, T, D]``."""
        return self.run(q, q, q)


class LambdaLayer(BrickworkAttention):
    """Lambda layer (brickwork ``lambda``) with position lambdas over ``seq_len``, then output dropout."""

    def __init__(
        self,
        dropout: float = 0.0,
        seq_len: int | None = None,
        dim_head: int | None = None,
        *_: Any,
        **__: Any,
    ) -> None:
        super().__init__()
        require(seq_len is not None and dim_head is not None, "LambdaLayer needs seq_len and dim_head")
        self.mechanism = bw.LambdaLayer(seq_len=as_int(seq_len), dim_head=as_int(dim_head))
        self.attn_drop = nn.Dropout(float(dropout))  # xformers dropped out of the layer's output
        self.requires_same_k_q_dimensions = True
        self.supports_attention_mask = False

    def forward(self, q, k, v, *_: Any, **__: Any) -> torch.Tensor:  # type: ignore[override]
        """q ``[B*H, Tq, D]``, k/v ``[B*H, Tk, D]`` -> ``[B*H, Tq, D]``."""
        return self.attn_drop(self.run(q, k, v))


class _SquareGridMixer(BrickworkAttention):
    """A token mixer over the square grid of tokens, run on the layer input in place of the multi-head
    layer (as xformers ran it); subclasses set ``self.mechanism``."""

    def __init__(self) -> None:
        super().__init__()
        self.supports_attention_mask = False
        self.requires_skip_multi_head = True
        self.requires_input_projection = False
        self.requires_same_k_q_dimensions = True
        self.requires_squared_context = True

    def forward(self, q, *_: Any, **__: Any) -> torch.Tensor:  # type: ignore[override]
        """q ``[B, T, E]`` (T a square) -> ``[B, T, E]``."""
        t = q.shape[-2]
        require(math.isqrt(t) ** 2 == t, f"{type(self).__name__} requires a squared context length, got {t}")
        return self.run(q, q, q)


class Pooling(_SquareGridMixer):
    """PoolFormer mixing over the square grid of tokens (brickwork ``pooling`` with ``grid=True``):
    ``avg_pool(x) - x`` on the layer input, skipping the multi-head layer as xformers did."""

    def __init__(
        self, pool_size: int = 3, stride: int = 1, padding: int | None = None, *_: Any, **__: Any
    ) -> None:
        super().__init__()
        check_mechanism("pooling", {"pool_size": pool_size, "stride": stride, "padding": padding}, "")
        self.mechanism = bw.Pooling(pool_size=as_int(pool_size), grid=True)


class VisualAttention(_SquareGridMixer):
    """Large-kernel attention (brickwork ``visual``) over the square grid of tokens, on the layer input."""

    def __init__(self, dim_model: int | None = None, *_: Any, **__: Any) -> None:
        super().__init__()
        require(dim_model is not None, "VisualAttention needs dim_model")
        self.mechanism = bw.VisualAttention(num_heads=1, dim_head=as_int(dim_model))
