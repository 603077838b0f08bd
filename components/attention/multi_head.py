"""Multi-head attention: projections, heads (GQA/MQA), KV cache and positional hooks around a mechanism."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import torch
from torch import nn

from brickwork.checks import Flag, Probability, check_bool, check_positive_int
from brickwork.components.attention.base import ATTENTION_REGISTRY, AttentionMechanism
from brickwork.components.attention.document_mask import DocumentMask, PositionBiasHook
from brickwork.components.attention.kv_cache import KVCache
from brickwork.components.attention.masks import add_bias
from brickwork.components.attention.qkv_layout import QKVLayout
from brickwork.components.configurable import Configurable
from brickwork.components.residual.norms import NORM_REGISTRY
from brickwork.errors import ConfigError

# A per-head norm: a registered norm name, a norm class or a functools.partial of one, built with
# ``dim=dim_head``.
NormSpec = str | type | functools.partial


class RotaryHook(Protocol):
    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, offset: int = 0, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class MultiHeadAttention(Configurable):
    """``forward(x, memory=None, attn_mask=None, cache=None)``: x ``[B, T, d]`` -> ``[B, T, d]``.

    Projects x (and ``memory`` for cross-attention) to ``num_heads`` query heads and ``num_kv_heads``
    key/value heads of size ``dim_head``, runs the attention mechanism, and projects back with
    ``out_proj``. Parameters are ``q_proj``/``k_proj``/``v_proj``, or ``qkv_proj`` when ``fused_qkv``,
    whose rows follow :meth:`qkv_layout` (per kv group: its query heads, its key head, its value head).

    - ``attention``: a registered mechanism name, an :class:`AttentionMechanism` subclass, a
      ``functools.partial`` of one, or a built instance. ``attention_options`` are its options;
      ``causal`` is passed to it, as are the head sizes it declares in ``needs``.
    - ``dropout``: applied to the output after ``out_proj`` (attention-probability dropout is the
      mechanism's own ``dropout`` option).
    - ``rotary``: ``rotary(q, k, offset=...) -> (q, k)`` on q ``[B, H, T, D]`` and k ``[B, Hkv, T, D]``
      after projection, self-attention only. ``position_bias``: ``position_bias(tq, tk, device)`` gives
      an additive ``[H, tq, tk]`` bias (e.g. ALiBi) merged into the mask. Both use the cache length as
      the position offset; ``positions`` [B, T] (each token's position, for left-padded rows) go to
      ``rotary(q, k, positions=...)`` instead. A relative bias needs none: padding shifts a row's
      queries and keys alike.
    - ``attn_mask``: boolean (True = may attend) or additive float, broadcastable to ``[B, H, Tq, Tk]``;
      or a :class:`DocumentMask` (packed documents, self-attention without a cache), which runs the
      mechanism itself (``components/attention/document_mask.py``).
    - ``cache``: a :class:`KVCache`. In self-attention the new keys/values are appended to it; in
      cross-attention it holds the projected ``memory`` after the first call, and later calls reuse it.
    - ``dim_head`` defaults to ``dim_model // num_heads``.
    - ``bias``: on every projection (True), on none (False), or on the projections into heads but not
      ``out_proj`` (``"qkv"``, as Qwen2).
    - ``qk_norm``: a norm (``NormSpec``) over each head's ``dim_head`` channels, applied to the queries and
      the keys after projection and before ``rotary``, as ``q_norm`` and ``k_norm`` (as Qwen3). Keys are
      cached normed.

    The tensor-parallel layer divides the attributes :meth:`tp_divide` names and shards the projections
    as :meth:`tp_plan` says; forward reads the head counts from those attributes.
    """

    def __init__(
        self,
        dim_model: int,
        num_heads: int,
        attention: str | type | functools.partial | AttentionMechanism = "scaled_dot_product",
        causal: Flag = False,
        num_kv_heads: int | None = None,
        bias: bool | Literal["qkv"] = True,
        fused_qkv: bool = False,
        dropout: Probability = 0.0,
        rotary: RotaryHook | None = None,
        position_bias: PositionBiasHook | None = None,
        attention_options: Mapping[str, Any] | None = None,
        dim_head: int | None = None,
        qk_norm: NormSpec | None = None,
    ) -> None:
        """The projections and the mechanism, from the options the class's docstring describes."""
        super().__init__()
        num_kv_heads, dim_head = check_geometry(dim_model, num_heads, num_kv_heads, dim_head)
        self.dim_model, self.dim_head = dim_model, dim_head
        # Read in forward, never cached in derived sizes: the parallel layer divides both per rank.
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.fused_qkv = fused_qkv
        self.mechanism = build_mechanism(attention, attention_options, causal, num_heads, dim_head)
        self.causal = self.mechanism.causal
        self.rotary, self.position_bias = rotary, position_bias
        check_mechanism_fits(
            type(self.mechanism), dim_model, num_heads, num_kv_heads, dim_head, fused_qkv,
            rotary is not None, position_bias is not None, qk_norm is not None,
        )  # fmt: skip
        into_heads = bias is not False
        if fused_qkv:
            self.qkv_proj = nn.Linear(dim_model, self.qkv_layout().size, bias=into_heads)
        elif self.mechanism.requires_input_projection:
            self.q_proj = nn.Linear(dim_model, num_heads * dim_head, bias=into_heads)
            self.k_proj = nn.Linear(dim_model, num_kv_heads * dim_head, bias=into_heads)
            self.v_proj = nn.Linear(dim_model, num_kv_heads * dim_head, bias=into_heads)
        self.q_norm = self.k_norm = None
        if qk_norm is not None:
            self.q_norm = NORM_REGISTRY.build(qk_norm, "qk_norm", dim=dim_head)
            self.k_norm = NORM_REGISTRY.build(qk_norm, "qk_norm", dim=dim_head)
        self.out_proj = nn.Linear(num_heads * dim_head, dim_model, bias=bias is True)
        self.dropout = nn.Dropout(dropout)

    @staticmethod
    def check_options(options: Any) -> None:
        """The head geometry, checked with the other options (``MultiHeadAttention.Config``) before
        anything is built."""
        check_geometry(options.dim_model, options.num_heads, options.num_kv_heads, options.dim_head)

    def qkv_layout(self) -> QKVLayout:
        """How ``qkv_proj``'s rows (and its output's last dim) hold the heads, at the current head counts."""
        return QKVLayout(self.num_heads, self.num_kv_heads, self.dim_head)

    def value_projection(self) -> tuple[nn.Linear, QKVLayout | None] | None:
        """The layer producing values, with the layout to find their rows when it is the fused
        ``qkv_proj``; None for a token mixer."""
        if not self.mechanism.requires_input_projection:
            return None
        return (self.qkv_proj, self.qkv_layout()) if self.fused_qkv else (self.v_proj, None)

    def residual_projections(self) -> tuple[str, ...]:
        """Children whose output is added back onto the residual stream (scaled by some inits)."""
        return ("out_proj",)

    def splits_by_head(self) -> bool:
        """Whether tensor parallel may give each rank a subset of the heads. Not for a token mixer (no
        heads), nor for a mechanism built for the full head count (one that ``needs`` ``num_heads``,
        e.g. compositional attention's rule map over all heads): those layers run whole on every rank."""
        return self.mechanism.requires_input_projection and "num_heads" not in self.mechanism.needs

    def tp_divide(self) -> tuple[str, ...]:
        """The head counts the tensor-parallel layer divides by its size; none for a layer that does not
        split by head, which sees the replicated input."""
        return ("num_heads", "num_kv_heads") if self.splits_by_head() else ()

    def tp_plan(self) -> dict[str, str]:
        """Tensor-parallel style of each child: projections into heads column-wise, ``out_proj`` row-wise,
        the per-head q/k norms ``per_head`` (replicated, on this rank's heads); every child replicated for
        a layer that does not split by head."""
        into_heads = ["qkv_proj"] if self.fused_qkv else ["q_proj", "k_proj", "v_proj"]
        if not self.mechanism.requires_input_projection:
            return {"out_proj": "replicate"}
        norms = ["q_norm", "k_norm"] if self.q_norm is not None else []
        if not self.splits_by_head():
            return dict.fromkeys([*into_heads, *norms, "out_proj"], "replicate")
        return {
            **dict.fromkeys(into_heads, "colwise"),
            **dict.fromkeys(norms, "per_head"),
            "out_proj": "rowwise",
        }

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        attn_mask: torch.Tensor | DocumentMask | None = None,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x ``[B, T, d]``, memory ``[B, S, d]`` (cross-attention) -> ``[B, T, d]``."""
        _check_sequence("x", x, self.dim_model)
        b, t, _ = x.shape
        if not self.mechanism.requires_input_projection:
            if memory is not None or cache is not None:
                raise ValueError(
                    f"{type(self.mechanism).__name__} mixes x itself: it takes no memory or cache"
                )
            heads = x.view(b, t, -1, self.dim_head).transpose(1, 2)  # (B, H, T, D)
            if isinstance(attn_mask, DocumentMask):  # raises: a token mixer takes no mask
                attn_mask.attend(self.mechanism, heads, heads, heads)
            out = self.mechanism(heads, heads, heads, attn_mask)
            return self.dropout(self.out_proj(out.transpose(1, 2).reshape(b, t, -1)))

        q, k, v = self._project(x, memory, cache)  # (B, H, T, D), (B, Hkv, S, D) x2
        offset = 0 if cache is None or memory is not None else cache.length
        if self.rotary is not None:
            if memory is not None:
                raise ValueError("rotary applies to self-attention; this layer was called with memory")
            if positions is None:
                q, k = self.rotary(q, k, offset=offset)
            else:
                q, k = self.rotary(q, k, positions=positions)
        if cache is not None and memory is None:
            k, v = cache.update(k, v)
        if k.shape[1] != q.shape[1] and not self.mechanism.supports_gqa:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        if isinstance(attn_mask, DocumentMask):
            out = attn_mask.attend(self.mechanism, q, k, v, self.position_bias)  # (B, H, T, D)
        else:
            if self.position_bias is not None:
                bias = self.position_bias(q.shape[-2], k.shape[-2], q.device).to(q.dtype)
                attn_mask = add_bias(attn_mask, bias)
            out = self.mechanism(q, k, v, attn_mask)  # (B, H, T, D)
        out = self.out_proj(out.transpose(1, 2).reshape(b, t, -1))
        # Dropout at p = 0 is the identity; skipping the module spares a small model's step its host cost.
        return self.dropout(out) if self.dropout.p else out

    def _project(
        self, x: torch.Tensor, memory: torch.Tensor | None, cache: KVCache | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        d = self.dim_head
        if self.fused_qkv:
            if memory is not None:
                raise ValueError("cross-attention needs separate projections; build with fused_qkv=False")
            layout = self.qkv_layout()
            group = layout.group
            qkv = layout.grouped(self.qkv_proj(x), dim=-1)  # (B, T, Hkv, H/Hkv + 2, D)
            if group == 1:  # one query head per kv head: one unbind (backward: one stack) gives all three
                return self._heads_first(*qkv.unbind(dim=-2))
            # One split, not three slices: its backward is one cat, where each slice's would fill a
            # zero tensor of the whole qkv and add the three up.
            q, k, v = qkv.split([group, 1, 1], dim=-2)
            return self._heads_first(q.reshape(b, t, -1, d), k.squeeze(-2), v.squeeze(-2))
        q = self.q_proj(x).view(b, t, -1, d)
        source = x
        if memory is not None:
            _check_sequence("memory", memory, self.dim_model)
            if memory.shape[0] != b:
                raise ValueError(f"memory batch {memory.shape[0]} differs from x batch {b}")
            if cache is not None and cache.length > 0:
                q = q if self.q_norm is None else self.q_norm(q)
                return q.transpose(1, 2), cache.keys, cache.values
            source = memory
        s = source.shape[1]
        q, k, v = self._heads_first(
            q, self.k_proj(source).view(b, s, -1, d), self.v_proj(source).view(b, s, -1, d)
        )
        if memory is not None and cache is not None:
            cache.update(k, v)
        return q, k, v

    def _heads_first(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, T, heads, D) -> (B, heads, T, D), q and k normed per head first (``qk_norm``): the norms
        see each head's channels last and the heads next to them, the layout tensor parallel splits."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def check_geometry(
    dim_model: int, num_heads: int, num_kv_heads: int | None, dim_head: int | None
) -> tuple[int, int]:
    """(num_kv_heads, dim_head) with their defaults filled in; ConfigError names the option at fault."""
    for option, value in (("dim_model", dim_model), ("num_heads", num_heads)):
        check_positive_int(value, option)
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    check_positive_int(num_kv_heads, "num_kv_heads")
    if num_heads % num_kv_heads:
        raise ConfigError(
            f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}",
            "num_kv_heads",
            related=["num_heads"],
        )
    if dim_head is None:
        if dim_model % num_heads:
            raise ConfigError(
                f"dim_model={dim_model} is not divisible by num_heads={num_heads}; change one of them or "
                "set dim_head",
                "num_heads",
            )
        dim_head = dim_model // num_heads
    check_positive_int(dim_head, "dim_head")
    return num_kv_heads, dim_head


def check_mechanism_fits(
    cls: type[AttentionMechanism],
    dim_model: int,
    num_heads: int,
    num_kv_heads: int,
    dim_head: int,
    fused_qkv: bool,
    rotary: bool,
    position_bias: bool,
    qk_norm: bool,
) -> None:
    """The rules between a mechanism's capabilities and the layer around it (token mixers have no
    projections to shape or rotate; an additive bias needs full mask support)."""
    check_bool(fused_qkv, "fused_qkv")
    name = cls.__name__
    if not cls.requires_input_projection:
        if num_heads * dim_head != dim_model:
            raise ConfigError(
                f"{name} mixes the input itself: num_heads * dim_head must equal dim_model={dim_model}",
                "dim_head",
                related=["num_heads"],
            )
        for option, bad in (("num_kv_heads", num_kv_heads != num_heads), ("rotary", rotary),
                            ("fused_qkv", fused_qkv), ("qk_norm", qk_norm)):  # fmt: skip
            if bad:
                raise ConfigError(f"{name} has no q/k/v projections, so {option} has no meaning", option)
    if position_bias and cls.mask_support != "full":
        raise ConfigError(
            f"{name} cannot take an additive position bias (it supports {cls.mask_support!r} masks)",
            "position_bias",
        )


def check_causal(cls: type[AttentionMechanism]) -> None:
    """Raise ConfigError (at ``causal``, listing the mechanisms that can) unless ``cls`` has a causal form."""
    if not cls.causal_safe:
        causal_ok = [n for n in ATTENTION_REGISTRY.names() if ATTENTION_REGISTRY.get(n).causal_safe]
        raise ConfigError(f"{cls.__name__} has no causal form", "causal", causal_ok)


def build_mechanism(
    attention: str | type | functools.partial | AttentionMechanism,
    options: Mapping[str, Any] | None,
    causal: bool,
    num_heads: int,
    dim_head: int,
) -> AttentionMechanism:
    """Resolve ``attention`` into a mechanism, passing ``causal`` and the head sizes it ``needs``."""
    if isinstance(attention, AttentionMechanism):
        if options:
            raise ConfigError("only applies when attention is a name, class or partial", "attention_options")
        if causal and not attention.causal:
            raise ConfigError(
                f"causal=True but the given {type(attention).__name__} instance is not causal", "causal"
            )
        return attention
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(
            f"must be a mapping of option names to values, got {options!r}", "attention_options"
        )
    cls = attention.func if isinstance(attention, functools.partial) else attention
    if isinstance(attention, str):
        cls = ATTENTION_REGISTRY.get(attention, "attention")
    if not (isinstance(cls, type) and issubclass(cls, AttentionMechanism)):
        return ATTENTION_REGISTRY.build(attention, "attention")  # raises, listing the choices
    label = cls.__name__
    allowed = cls.option_names()
    kwargs = dict(options or {})  # a copy: the caller's mapping is never changed
    for key in kwargs:
        if key not in allowed:
            raise ConfigError(f"unknown option for {label}", f"attention_options.{key}", allowed, key)
    if causal:
        check_causal(cls)
        if kwargs.get("causal", True) is not True:
            raise ConfigError("conflicts with causal=True", "attention_options.causal")
        kwargs["causal"] = True
    sizes = {"num_heads": num_heads, "dim_head": dim_head}
    for need in cls.needs:
        if kwargs.get(need, sizes[need]) != sizes[need]:
            raise ConfigError(
                f"is set by the layer to {sizes[need]}, got {kwargs[need]!r}", f"attention_options.{need}"
            )
        kwargs[need] = sizes[need]
    return ATTENTION_REGISTRY.build(attention, "attention", **kwargs)


def _check_sequence(label: str, x: torch.Tensor, dim_model: int) -> None:
    if x.dim() != 3 or x.shape[-1] != dim_model:
        raise ValueError(f"{label} must be [B, T, dim_model={dim_model}], got shape {tuple(x.shape)}")
