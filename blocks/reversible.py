"""Reversible stacks (RevNet coupling; Gomez et al. 2017, as in Reformer and xformers' ``reversible``).

Each block's two sublayers become the coupling's two functions, F = attention(attention_norm(.)) and
G = feedforward(feedforward_norm(.)), on two streams that start as copies of the input:

    y1 = x1 + F(x2)        y2 = x2 + G(y1)          output = (y1 + y2) / 2 after the last block

Inputs are recomputed from outputs in the backward pass (x2 = y2 - G(y1), x1 = y1 - F(x2)), so
training keeps no activation per block: memory stays flat with depth, for a second forward of each
block in the backward. Dropout draws are replayed from saved RNG states, so the recomputation sees
the same masks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from brickwork.blocks.block import Block
from brickwork.components.attention import KVCache
from brickwork.components.residual import PreNormResidual
from brickwork.errors import ConfigError


def _attend(
    block: Block,
    x: torch.Tensor,
    attn_mask: torch.Tensor | None,
    cache: KVCache | None,
    positions: torch.Tensor | None,
) -> torch.Tensor:
    return block.attention(block.attention_norm(x), attn_mask=attn_mask, cache=cache, positions=positions)


def _feed(block: Block, x: torch.Tensor) -> torch.Tensor:
    return block.feedforward(block.feedforward_norm(x))


class _ReversibleFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, attn_mask: torch.Tensor | None, positions: torch.Tensor | None,
                blocks: Sequence[Block], *params: torch.Tensor) -> torch.Tensor:  # fmt: skip
        devices = [h.device.index] if h.is_cuda else []
        states = []
        x1 = x2 = h
        for block in blocks:
            f_state = _rng_state(h)
            x1 = x1 + _attend(block, x2, attn_mask, None, positions)
            g_state = _rng_state(h)
            x2 = x2 + _feed(block, x1)
            states.append((f_state, g_state))
        ctx.blocks, ctx.states, ctx.devices, ctx.attn_mask = blocks, states, devices, attn_mask
        ctx.positions = positions
        ctx.save_for_backward(x1.detach(), x2.detach())
        return (x1 + x2) / 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        y1, y2 = ctx.saved_tensors
        dy1 = dy2 = grad / 2
        param_grads: dict[int, torch.Tensor] = {}
        for block, (f_state, g_state) in zip(reversed(ctx.blocks), reversed(ctx.states)):
            with torch.enable_grad(), torch.random.fork_rng(devices=ctx.devices):
                _set_rng_state(g_state, y1)
                y1 = y1.detach().requires_grad_()
                g_out = _feed(block, y1)
                g_params = [*block.feedforward_norm.parameters(), *block.feedforward.parameters()]
                grads = torch.autograd.grad(g_out, (y1, *g_params), dy2, allow_unused=True)
            x2 = y2 - g_out.detach()
            dx1 = dy1 + grads[0]
            _accumulate(param_grads, g_params, grads[1:])
            with torch.enable_grad(), torch.random.fork_rng(devices=ctx.devices):
                _set_rng_state(f_state, x2)
                x2 = x2.detach().requires_grad_()
                f_out = _attend(block, x2, ctx.attn_mask, None, ctx.positions)
                f_params = [*block.attention_norm.parameters(), *block.attention.parameters()]
                grads = torch.autograd.grad(f_out, (x2, *f_params), dx1, allow_unused=True)
            x1 = y1.detach() - f_out.detach()
            dx2 = dy2 + grads[0]
            _accumulate(param_grads, f_params, grads[1:])
            y1, y2, dy1, dy2 = x1, x2.detach(), dx1, dx2
        params = [p for block in ctx.blocks for p in block.parameters()]
        return dy1 + dy2, None, None, None, *(param_grads.get(id(p)) for p in _unique(params))


def _rng_state(like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(like.device) if like.is_cuda else None


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], like: torch.Tensor) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], like.device)


def _accumulate(into: dict[int, torch.Tensor], params: Sequence[torch.Tensor], grads: Sequence[Any]) -> None:
    for p, g in zip(params, grads):
        if g is not None:
            into[id(p)] = g if id(p) not in into else into[id(p)] + g


def _unique(params: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return list({id(p): p for p in params}.values())  # in first-seen order


class ReversibleLayers(nn.ModuleList):
    """A stack of pre-norm :class:`Block` s run as a reversible stack: ``layers(h, attn_mask=None,
    caches=None, positions=None) -> h``, ``[B, T, d]`` both.

    Blocks must be self-attention only (no cross-attention). When no gradient is being recorded, or
    with KV caches (decoding), the same coupling runs without the recomputation. A float ``attn_mask``
    gets no gradient. Pipeline parallelism splits a model at its blocks, which a reversible stack does
    not have on their own, so it does not apply to one.
    """

    def __init__(self, blocks: Sequence[Block]) -> None:
        for i, block in enumerate(blocks):
            # The coupling calls each sublayer on its norm's output itself, so any other residual
            # style (a subclass of pre-norm included), or a third sublayer, would be silently dropped.
            if (
                not isinstance(block, Block)
                or block.cross_attention is not None
                or type(block.residual) is not PreNormResidual
            ):
                raise ConfigError(
                    "a reversible stack couples pre-norm self-attention sublayers; block "
                    f"{i} is not one (cross-attention, or a residual other than 'pre')",
                    "blocks",
                )
        super().__init__(blocks)

    def forward(
        self,
        h: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        caches: Sequence[KVCache] | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if caches is None and torch.is_grad_enabled():
            params = _unique([p for block in self for p in block.parameters()])
            return _ReversibleFunction.apply(h, attn_mask, positions, list(self), *params)
        x1 = x2 = h
        for i, block in enumerate(self):
            x1 = x1 + _attend(block, x2, attn_mask, caches[i] if caches else None, positions)
            x2 = x2 + _feed(block, x1)
        return (x1 + x2) / 2


def as_layers(layers: Sequence[nn.Module]) -> nn.ModuleList:
    """A model's ``layers``: a given :class:`ReversibleLayers` (or other ModuleList) as it is."""
    return layers if isinstance(layers, nn.ModuleList) else nn.ModuleList(layers)


def run_layers(
    layers: nn.ModuleList,
    h: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    caches: Sequence[KVCache] | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """``h`` through a model's ``layers``: a reversible stack as a whole, plain blocks one by one.
    ``positions`` [B, T] are each token's position where rows differ (left padding), for rotary."""
    if isinstance(layers, ReversibleLayers):
        return layers(h, attn_mask=attn_mask, caches=caches, positions=positions)
    for i, layer in enumerate(layers):
        h = layer(h, attn_mask=attn_mask, cache=caches[i] if caches else None, positions=positions)
    return h
