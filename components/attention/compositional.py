"""Compositional attention: every search (a q/k attention pattern) retrieves from every rule (a value
head), and each search then picks its mix of rules with a second, small attention.

Mittal et al., "Compositional Attention: Disentangling Search and Retrieval" (2022),
https://arxiv.org/abs/2110.09419
"""

from __future__ import annotations

import math
from typing import Annotated

import torch
import torch.nn.functional as F
from torch import nn

from brickwork.checks import Flag, OneOf, PositiveInt, Probability
from brickwork.components.attention.base import AttentionMechanism, register_attention
from brickwork.components.attention.scaled_dot_product import dense_attention

SELECTIONS = ("dot", "linear", "mlp")


@register_attention("compositional")
class CompositionalAttention(AttentionMechanism):
    """For search head s and rule r: ``o_sr = softmax(q_s k_sᵀ / √D + mask) v_r``, with the ``num_rules``
    value rules mixed from the value heads by a learned ``[H, R]`` map; then
    ``out_s = Σ_r softmax_r((q_s W_q)·(o_sr W_k) / √dim_selection) o_sr``.

    The searches are ordinary softmax attention, so masks and ``causal`` work as in
    ``scaled_dot_product``; the rule choice is made per position, so causality is kept.
    ``num_rules`` defaults to the head count; ``dim_selection`` to the head size. ``selection`` scores
    the rules: ``"dot"`` as above; ``"linear"`` / ``"mlp"`` by a small network (one linear layer, or
    two with a ReLU) on ``[o_sr, q_s W_q]``, the paper's score network. The rules mix all
    heads, so it cannot be split by head for tensor parallelism (the ``[H, R]`` map needs every head).
    """

    causal_safe = True
    mask_support = "full"
    needs = ("num_heads", "dim_head")

    def __init__(
        self,
        num_heads: PositiveInt | None = None,
        dim_head: PositiveInt | None = None,
        num_rules: PositiveInt | None = None,
        dim_selection: PositiveInt | None = None,
        causal: Flag = False,
        dropout: Probability = 0.0,
        selection: Annotated[str, OneOf(SELECTIONS)] = "dot",
    ) -> None:
        super().__init__()
        if num_heads is None or dim_head is None:
            raise ValueError(
                "CompositionalAttention needs num_heads and dim_head (MultiHeadAttention gives them)"
            )
        self.num_rules = num_rules or num_heads
        self.dim_selection = dim_selection or dim_head
        self.causal, self.dropout = causal, dropout
        self.rule_mix = nn.Parameter(torch.empty(num_heads, self.num_rules))
        self.selection_query = nn.Linear(dim_head, self.dim_selection, bias=False)
        self.selection = selection
        if selection == "dot":
            self.selection_key = nn.Linear(dim_head, self.dim_selection, bias=False)
        else:
            width = self.dim_selection + dim_head
            self.score_network = (
                nn.Linear(width, 1)
                if selection == "linear"
                else nn.Sequential(
                    nn.Linear(width, self.dim_selection), nn.ReLU(), nn.Linear(self.dim_selection, 1)
                )
            )
        nn.init.kaiming_uniform_(self.rule_mix, a=math.sqrt(5))

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q ``[B, H, Tq, D]``, k/v ``[B, H, Tk, D]`` -> ``[B, H, Tq, D]``."""
        self.check_inputs(q, k, v, attn_mask)
        b, h, tq, d = q.shape
        rules = torch.einsum("bhtd,hr->brtd", v, self.rule_mix.to(v.dtype))  # (B, R, Tk, D)
        # Every search against every rule: the searches repeat over rules, the rules over searches.
        r = self.num_rules
        qs = q.unsqueeze(2).expand(b, h, r, tq, d).reshape(b, h * r, tq, d)
        ks = k.unsqueeze(2).expand(b, h, r, *k.shape[-2:]).reshape(b, h * r, *k.shape[-2:])
        vs = rules.unsqueeze(1).expand(b, h, r, *rules.shape[-2:]).reshape(b, h * r, *rules.shape[-2:])
        mask = attn_mask
        if mask is not None and mask.dim() == 4 and mask.shape[1] == h:
            mask = mask.repeat_interleave(r, dim=1)
        dropout_p = self.dropout if self.training else 0.0
        retrieved = dense_attention(qs, ks, vs, mask, self.causal, dropout_p).view(b, h, r, tq, d)
        query = self.selection_query(q).unsqueeze(2)  # (B, H, 1, Tq, S)
        if self.selection == "dot":
            scores = (query * self.selection_key(retrieved)).sum(-1) * self.dim_selection**-0.5
        else:
            pairs = torch.cat([retrieved, query.expand(-1, -1, r, -1, -1)], dim=-1)  # (B, H, R, Tq, D + S)
            scores = self.score_network(pairs).squeeze(-1)
        choice = F.softmax(scores, dim=2)  # (B, H, R, Tq)
        return (choice.unsqueeze(-1) * retrieved).sum(dim=2)
