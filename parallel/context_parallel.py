"""Context parallel: the sequence of every layer split over the "cp" ranks (``context_parallel_size``).

Each cp rank holds a contiguous slice of T / cp positions of every sequence, through the whole model:
embeddings, norms, feedforwards and the LM head work per token and need nothing. Attention is the one
place positions meet. Its queries stay local; its keys and values are all-gathered from the cp ranks
(Llama 3's context parallel, Megatron's ``cp_comm_type="all_gather"``), with torch's differentiable
``all_gather_single_autograd``, whose backward reduce-scatters the key/value gradients back to the
ranks that own them. The mechanism's own SDPA call then runs unchanged: a causal rank r keeps the
gathered keys up to the end of its slice, (r + 1) · T/cp, where SDPA's bottom-right aligned causal mask
is exactly the mask of global positions. Positions are made global by shifting each position module's
``offset`` by r · T/cp (learned and sine tables, rotary angles); ALiBi's bias is asked for the keys up
to the end of the slice, so its bottom-right alignment places the queries where they are.

Packed documents (``DecoderLM.forward(document_ids=)``, sliced like the tokens): a hook on the decoder
all-gathers the integer document ids once per forward and hands the model, in their place, one
:class:`SliceDocumentMask` for every layer: the document-causal rows of the rank's queries against
the keys 0..(r + 1) · T/cp (FlexAttention's block mask with the query rows shifted, or the same rule
dense, as :class:`~brickwork.components.attention.DocumentMask` chooses). Its positions, each token's
place in its own document, are global already, and a position module given ``positions`` uses them
in place of the shifted offset; the mask gathers the keys and values itself, and ALiBi, asked for
all of them, places the queries by the same bottom-right rule (its score_mod with the query rows
shifted by r · T/cp).

Why not torch's ``context_parallel`` (ring attention on DTensor): it dispatches only the CUDA SDPA ops
(flash, efficient, cuDNN); on CPU, SDPA's ``_scaled_dot_product_flash_attention_for_cpu`` has no
sharding strategy and its math backend fails on mixed Tensor/DTensor inputs (torch 2.13). One
implementation serves every device. Everything here is forward hooks: the components know nothing of it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed._functional_collectives import all_gather_single_autograd
from torch.distributed.device_mesh import DeviceMesh

from brickwork.blocks.decoder_lm import DecoderLM
from brickwork.blocks.encoder_decoder import EncoderDecoder
from brickwork.blocks.image_encoder import ImageEncoder
from brickwork.components.attention.base import ATTENTION_REGISTRY, AttentionMechanism
from brickwork.components.attention.document_mask import DocumentMask, PositionBiasHook
from brickwork.components.attention.multi_head import MultiHeadAttention
from brickwork.components.positional.alibi import ALiBi
from brickwork.components.positional.base import PositionalEncoding
from brickwork.errors import ConfigError
from brickwork.parallel.config import ParallelConfig

KEY = "context_parallel_size"


def check_context_parallel(model: nn.Module, cp: int) -> None:
    """ConfigError at ``context_parallel_size`` (``cp``) unless ``model`` reads one sequence of token
    ids a row (the train step splits those: brickwork/train/batch.py) and every attention layer of it
    can attend from a sequence slice: exact softmax attention, rotary as a module, ALiBi on causal
    layers only."""
    if cp == 1:
        return
    if isinstance(model, EncoderDecoder | ImageEncoder):
        reads = "a source and a target sequence" if isinstance(model, EncoderDecoder) else "images"
        raise ConfigError(
            f"context_parallel_size={cp} splits the one sequence of token ids each row is; "
            f"{type(model).__name__} reads {reads}",
            KEY,
        )
    layers = [(p, m) for p, m in model.named_modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ConfigError(
            f"context_parallel_size={cp} splits the attention of brickwork MultiHeadAttention layers; "
            f"{type(model).__name__} has none",
            KEY,
        )
    safe = [n for n in ATTENTION_REGISTRY.names() if ATTENTION_REGISTRY.get(n).context_parallel_safe]
    for path, layer in layers:
        mechanism = type(layer.mechanism)
        if not mechanism.context_parallel_safe:
            name = next((n for n in ATTENTION_REGISTRY if ATTENTION_REGISTRY.get(n) is mechanism), None)
            raise ConfigError(
                f"attention {name or mechanism.__name__!r} at {path} cannot run under context_parallel_size"
                f"={cp}: it does not compute exact softmax attention from q, k and v, so keys gathered "
                f"from other ranks would change what it computes; mechanisms that can: {safe}",
                KEY,
            )
        if layer.rotary is not None and not isinstance(layer.rotary, nn.Module):
            raise ConfigError(
                f"the rotary hook at {path} is a plain callable; context parallel shifts the positions of "
                "a module's forward (build it with brickwork's RotaryEmbedding)",
                KEY,
            )
        bias = layer.position_bias
        if bias is not None and (not isinstance(bias, ALiBi) or not layer.causal):
            raise ConfigError(
                f"the position bias at {path} ({type(bias).__name__} on a "
                f"{'causal' if layer.causal else 'non-causal'} layer) cannot be placed on a sequence slice; "
                "context parallel supports ALiBi on causal layers",
                KEY,
            )


def apply_context_parallel(model: nn.Module, mesh: DeviceMesh, config: ParallelConfig) -> nn.Module:
    """Hook every attention layer and position module of ``model`` so that it runs on this rank's
    slice of the sequence over ``mesh``'s "cp" dim (see the module docstring), in place, after
    :func:`check_context_parallel`. Returns ``model``; nothing happens at context_parallel_size 1."""
    check_context_parallel(model, config.context_parallel_size)
    if config.context_parallel_size == 1:
        return model
    cp_mesh = mesh["cp"]
    rank, group = cp_mesh.get_local_rank(), cp_mesh.get_group()
    if isinstance(model, DecoderLM):
        model.register_forward_pre_hook(_slice_documents(rank, group), with_kwargs=True)
        if model.max_seq_len is not None:
            # The model checks the length it sees, the slice; the limit is on the whole sequence.
            model.token_embedding.register_forward_pre_hook(_limit_length(cp_mesh.size(), model.max_seq_len))
    hooked: set[int] = set()

    def once(module: nn.Module, hook: Any) -> None:  # a module shared by layers is hooked once
        if id(module) not in hooked:
            hooked.add(id(module))
            module.register_forward_pre_hook(hook, with_kwargs=True)

    for layer in model.modules():
        if not isinstance(layer, MultiHeadAttention):
            continue
        layer.register_forward_pre_hook(_refuse_unsplittable, with_kwargs=True)
        once(layer.mechanism, _gather_keys_values(rank, group, layer.mechanism))
        if layer.rotary is not None:
            once(layer.rotary, _shift_offset(rank, index=2))
        if layer.position_bias is not None:
            once(layer.position_bias, _extend_bias_keys(rank))
    for module in model.modules():
        if isinstance(module, PositionalEncoding):  # the additive ones: attention's are hooked above
            once(module, _shift_offset(rank, index=1))
    return model


def sequence_shard(tensor: torch.Tensor, cp_mesh: DeviceMesh, name: str, dim: int = 1) -> torch.Tensor:
    """This cp rank's contiguous slice of ``tensor`` along ``dim`` (the sequence): ``[B, T, ...] ->
    [B, T / cp, ...]``. ValueError naming ``name`` unless T divides by cp."""
    cp = cp_mesh.size()
    length = tensor.shape[dim]
    if length % cp:
        raise ValueError(
            f"{name} has sequence length {length}, which context_parallel_size={cp} does not divide; "
            f"pad or cut the sequences to a multiple of {cp}"
        )
    return tensor.chunk(cp, dim=dim)[cp_mesh.get_local_rank()]


class SliceDocumentMask(DocumentMask):
    """The document mask of one cp rank: ``document_ids`` [B, end] the gathered ids of positions
    0..end of the sequence, the queries its last ``queries`` (this rank's slice). :meth:`attend`
    takes the local keys and values and all-gathers them first (the backward reduce-scatters)."""

    def __init__(self, document_ids: torch.Tensor, queries: int, group: ProcessGroup) -> None:
        super().__init__(document_ids, queries)
        self.group = group

    def attend(
        self,
        mechanism: AttentionMechanism,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        position_bias: PositionBiasHook | None = None,
    ) -> torch.Tensor:
        end = self.document_ids.shape[1]  # keys past the slice are in every query's future
        k, v = (all_gather_single_autograd(t.contiguous(), 2, self.group)[:, :, :end] for t in (k, v))
        return super().attend(mechanism, q, k, v, position_bias)


def _slice_documents(rank: int, group: ProcessGroup) -> Any:
    """``DecoderLM.forward``'s ``document_ids`` [B, T/cp] -> this rank's :class:`SliceDocumentMask`."""

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        local = kwargs.get("document_ids")
        if not isinstance(local, torch.Tensor):
            return None
        # Integers without a gradient: c10d's all-gather, which returns plain tensors (the functional
        # one's may be an asynchronous wrapper, which the mask's compiled rule would capture on CUDA).
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local.contiguous(), group=group)
        ids = torch.cat(parts, dim=1)  # (B, T)
        queries = local.shape[1]
        documents = SliceDocumentMask(ids[:, : (rank + 1) * queries], queries, group)
        return args, {**kwargs, "document_ids": documents}

    return hook


def _refuse_unsplittable(layer: MultiHeadAttention, args: tuple, kwargs: dict) -> None:
    """A KV cache, cross-attention memory or a mask cover positions this rank does not hold, but for
    the :class:`SliceDocumentMask` the decoder's hook builds (a plain document mask, e.g. a pipeline
    stage's, would hold this slice's documents alone)."""
    for name in ("cache", "memory", "attn_mask"):
        if kwargs.get(name) is not None and not isinstance(kwargs[name], SliceDocumentMask):
            raise ValueError(
                f"context parallel attention takes no {name}: each rank holds a slice of the sequence "
                "(self-attention over whole, unpadded sequences, or packed ones through the decoder's "
                "document_ids; train with TrainStep, which splits the batch, and decode without "
                "context parallel)"
            )


def _limit_length(cp: int, max_seq_len: int) -> Any:
    def hook(module: nn.Module, args: tuple) -> None:
        end = cp * args[0].shape[-1]
        if end > max_seq_len:
            raise ValueError(f"input_ids reach position {end}, beyond max_seq_len={max_seq_len}")

    return hook


def _gather_keys_values(rank: int, group: ProcessGroup, mechanism: AttentionMechanism) -> Any:
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        q, k, v, *rest = args  # (B, H, T/cp, D), (B, Hkv, T/cp, D) x2
        keys = [all_gather_single_autograd(t.contiguous(), 2, group) for t in (k, v)]  # (B, Hkv, T, D)
        if mechanism.causal:
            # Keys past this slice are in every local query's future; without them SDPA's bottom-right
            # causal mask puts query i at global position rank · T/cp + i.
            keys = [t[:, :, : (rank + 1) * q.shape[-2]] for t in keys]
        return (q, *keys, *rest), kwargs

    return hook


def _shift_offset(rank: int, index: int) -> Any:
    """A position module's ``offset`` (argument ``index``) moved to this slice's first position. A
    module given ``positions`` (packed documents' own, global already) uses them in place of the
    offset, as every position module does, so the shift does not reach them."""

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        shift = rank * args[0].shape[-2]
        if len(args) > index:
            args = (*args[:index], args[index] + shift, *args[index + 1 :])
        else:
            kwargs = {**kwargs, "offset": kwargs.get("offset", 0) + shift}
        return args, kwargs

    return hook


def _extend_bias_keys(rank: int) -> Any:
    """ALiBi's ``(tq, tk)`` -> keys up to the end of this slice (the causal layer's gathered keys).
    Asked for more keys than queries, it is asked by a :class:`SliceDocumentMask`, whose keys are
    those already."""

    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        tq, tk, *rest = args
        if tk != tq:
            return None
        return (tq, tk + rank * tq, *rest), kwargs

    return hook
