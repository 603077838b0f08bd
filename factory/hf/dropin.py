"""brickwork attention inside other codebases: same weights in, the host's calling convention out.

``*_attention(...)`` builds a :class:`MultiHeadAttention` carrying the weights of an HF GPT-2 or
BERT attention (by the weight map of the family's module), or of a ``torch.nn.MultiheadAttention``.
The adapters wrap it so that it can take the original module's place: they accept the host's
arguments and return what the host expects. The mechanism can then be swapped like any brickwork
attention (``mha.attention = ...``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from brickwork.components.attention import MultiHeadAttention
from brickwork.components.attention.masks import causal_keep

from . import bert, gpt2
from .family import Rule


def gpt2_attention(hf_attention: nn.Module, **options: Any) -> MultiHeadAttention:
    """A causal MHA with the weights of an HF ``GPT2Attention`` (``options`` go to the constructor)."""
    heads, dim = hf_attention.num_heads, hf_attention.embed_dim
    mha = MultiHeadAttention(dim, heads, causal=True, bias=True, fused_qkv=True, **options)
    return _load(mha, hf_attention, gpt2.attention_rules("", "", heads, dim // heads))


def bert_attention(hf_attention: nn.Module, **options: Any) -> MultiHeadAttention:
    """A bidirectional MHA with the weights of an HF ``BertAttention`` (self-attention + output dense)."""
    self_attention = hf_attention.self
    dim = self_attention.query.in_features
    mha = MultiHeadAttention(dim, self_attention.num_attention_heads, bias=True, fused_qkv=False, **options)
    return _load(mha, hf_attention, bert.attention_rules("", ""))


@torch.no_grad()
def _load(mha: MultiHeadAttention, hf_attention: nn.Module, rules: list[Rule]) -> MultiHeadAttention:
    """Copy the host's attention weights into ``mha`` by the family's weight map."""
    state = hf_attention.state_dict()
    for rule in rules:
        mha.get_parameter(rule.bw).copy_(rule.to_bw(state[rule.hf]))
    return mha


@torch.no_grad()
def torch_attention(attention: nn.MultiheadAttention, **options: Any) -> MultiHeadAttention:
    """An MHA with the weights of a self-attention ``nn.MultiheadAttention`` (packed in_proj, with biases)."""
    if not attention._qkv_same_embed_dim or attention.in_proj_bias is None:
        raise ValueError("only nn.MultiheadAttention with a packed in_proj and biases is supported")
    if attention.bias_k is not None or attention.add_zero_attn:
        raise ValueError(
            "nn.MultiheadAttention with add_bias_kv or add_zero_attn has no brickwork equivalent"
        )
    mha = MultiHeadAttention(attention.embed_dim, attention.num_heads, bias=True, fused_qkv=False, **options)
    weights = zip(attention.in_proj_weight.chunk(3), attention.in_proj_bias.chunk(3))
    for proj, (w, b) in zip((mha.q_proj, mha.k_proj, mha.v_proj), weights):
        proj.weight.copy_(w)
        proj.bias.copy_(b)
    mha.out_proj.weight.copy_(attention.out_proj.weight)
    mha.out_proj.bias.copy_(attention.out_proj.bias)
    return mha


def _hf_cache(cache: Any, kwargs: dict[str, Any]) -> Any:
    """The HF cache a host layer passed, under its name since transformers 5.24 or the older one."""
    return cache if cache is not None else kwargs.get("cache", kwargs.get("past_key_values"))


class GPT2AttentionAdapter(nn.Module):
    """Stands in for ``GPT2Block.attn``: ``(hidden_states [B, T, d], attention_mask=...) -> (out, None)``.

    HF's KV cache is not kept: call the host with ``use_cache=False``. HF passes the cache as
    ``cache=`` from transformers 5.24 on and as ``past_key_values=`` before; either one is refused.
    """

    def __init__(self, attention: MultiHeadAttention) -> None:
        super().__init__()
        self.attention = attention

    def forward(
        self,
        hidden_states: torch.Tensor,
        cache: Any = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        if _hf_cache(cache, kwargs) is not None:
            raise ValueError("GPT2AttentionAdapter keeps no HF cache; call the model with use_cache=False")
        return self.attention(hidden_states, attn_mask=attention_mask), None


class BertAttentionAdapter(nn.Module):
    """Stands in for ``BertLayer.attention``: ``norm(x + dropout(attention(x)))``, returns ``(out, None)``.

    ``norm`` and ``dropout`` are the host's own ``attention.output.LayerNorm`` and ``.dropout``.
    """

    def __init__(self, attention: MultiHeadAttention, norm: nn.Module, dropout: nn.Module) -> None:
        super().__init__()
        self.attention = attention
        self.norm = norm
        self.dropout = dropout

    def forward(
        self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> tuple[torch.Tensor, None]:
        if kwargs.get("encoder_hidden_states") is not None or _hf_cache(None, kwargs) is not None:
            raise ValueError("BertAttentionAdapter does self-attention only, without an HF cache")
        out = self.attention(hidden_states, attn_mask=attention_mask)
        return self.norm(hidden_states + self.dropout(out)), None


class TorchAttentionAdapter(nn.Module):
    """Stands in for a self-attention ``nn.MultiheadAttention``, e.g. ``TransformerEncoderLayer.self_attn``.

    Called as ``(query, key, value, key_padding_mask=None, need_weights=..., attn_mask=None,
    is_causal=False) -> (out, None)`` with torch's mask conventions (a boolean True = masked out).
    It has no packed ``in_proj``, which also keeps torch's fused encoder fast path away from it
    (build ``nn.TransformerEncoder`` with ``enable_nested_tensor=False``).
    """

    in_proj_weight = None
    in_proj_bias = None
    _qkv_same_embed_dim = False

    def __init__(self, attention: MultiHeadAttention, batch_first: bool = True) -> None:
        super().__init__()
        self.attention = attention
        self.batch_first = batch_first
        self.num_heads = attention.num_heads

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, None]:
        if not (query is key and key is value):
            raise ValueError("TorchAttentionAdapter does self-attention only (query, key and value the same)")
        x = query if self.batch_first else query.transpose(0, 1)  # [B, T, d]
        mask = _allowed(attn_mask, key_padding_mask, x.dtype)
        if is_causal and attn_mask is None:
            causal = causal_keep(x.shape[1], x.shape[1], x.device)
            mask = causal if mask is None else mask & causal
        out = self.attention(x, attn_mask=mask)
        return (out if self.batch_first else out.transpose(0, 1)), None


def _allowed(
    attn_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None, dtype: torch.dtype
) -> torch.Tensor | None:
    """torch's masks (bool True = masked out, or additive float) -> one brickwork mask."""
    mask = None
    if attn_mask is not None:
        mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask.to(dtype)
    if key_padding_mask is not None:
        if key_padding_mask.dtype == torch.bool:
            keep = ~key_padding_mask[:, None, None, :]
        else:
            keep = key_padding_mask.to(dtype)[:, None, None, :]
        if mask is None:
            mask = keep
        elif mask.dtype == torch.bool and keep.dtype == torch.bool:
            mask = mask & keep
        else:
            mask = _additive(mask, dtype) + _additive(keep, dtype)
    return mask


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
