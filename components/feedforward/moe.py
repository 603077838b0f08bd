"""Mixture of experts with a top-k softmax router and a load-balancing loss (Switch / GShard)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import torch
from torch import nn

from brickwork.checks import Flag, NonNegative, OneOf, PositiveInt, Probability
from brickwork.errors import ConfigError

from .activations import Activation
from .base import FEEDFORWARD_REGISTRY, Feedforward, register_feedforward
from .grouped_experts import grouped_experts_forward, use_grouped_mm

EXPERT_KINDS = ("mlp", "glu", "swiglu", "geglu")


@register_feedforward("moe")
class MixtureOfExperts(Feedforward):
    """Each token goes to its ``top_k`` experts; their outputs are summed, weighted by router probability.

    x ``[B, T, dim_model]`` -> ``[B, T, dim_model]``. The router is a bias-free ``Linear(dim_model,
    num_experts)`` followed by a softmax; with ``normalize_top_k`` the chosen probabilities are rescaled
    to sum to one (Mixtral, GShard), otherwise used as they are (Switch).

    After each forward, ``aux_loss`` holds the load-balancing loss
    ``num_experts * sum_i f_i * P_i``: ``f_i`` is the fraction of the ``N * top_k`` token-to-expert
    assignments that went to expert ``i``, ``P_i`` the router probability of ``i`` averaged over the
    ``N`` tokens. It is 1 for perfectly balanced routing. ``aux_loss_weight`` is its coefficient
    in the training objective (``brickwork.train`` adds ``aux_loss_weight * aux_loss``; 0 = off), and
    ``expert_counts`` ``[num_experts]`` holds how many assignments each expert got.

    The experts live in an :class:`Experts` bank that takes the token rows grouped by expert, so that
    expert parallel (parallel/expert_parallel.py) can move those rows to the ranks holding their
    experts around the bank's forward without this module knowing. Every expert runs on every
    forward, on zero rows when no token chose it, so its parameters always take part in backward
    (with zero gradient): data parallel and ZeRO then reduce the same parameters on every rank,
    whatever the routing.
    """

    def __init__(
        self,
        dim_model: PositiveInt,
        num_experts: PositiveInt = 8,
        top_k: PositiveInt = 2,
        hidden_dim: PositiveInt | None = None,
        expert: Annotated[str, OneOf(EXPERT_KINDS)] = "mlp",
        activation: Activation | None = None,
        dropout: Probability = 0.0,
        bias: Flag = True,
        normalize_top_k: Flag = True,
        aux_loss_weight: NonNegative = 0.01,
    ) -> None:
        """``expert`` is one of mlp, glu, swiglu, geglu, built with ``hidden_dim``, ``dropout``,
        ``bias`` and, where given, ``activation`` (else the expert's default)."""
        super().__init__()
        self.dim_model = dim_model
        self.num_experts = num_experts
        self.top_k = top_k
        self.normalize_top_k = normalize_top_k
        self.aux_loss_weight = float(aux_loss_weight)
        self.router = nn.Linear(dim_model, num_experts, bias=False)
        options: dict[str, object] = {"hidden_dim": hidden_dim, "dropout": dropout, "bias": bias}
        if activation is not None:
            options["activation"] = activation
        self.experts = Experts(
            [
                FEEDFORWARD_REGISTRY.build(expert, "expert", dim_model=dim_model, **options)
                for _ in range(num_experts)
            ]
        )
        self.aux_loss: torch.Tensor | None = None
        self.expert_counts: torch.Tensor | None = None

    @staticmethod
    def check_options(options: Any) -> None:
        if options.top_k > options.num_experts:
            raise ConfigError(
                f"must be at most num_experts={options.num_experts}, got {options.top_k}", "top_k"
            )
        if options.activation is not None and options.expert in ("swiglu", "geglu"):
            raise ConfigError(
                f"expert {options.expert!r} fixes its activation; use expert 'glu' to choose one",
                "activation",
            )

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens ``[N, d]`` -> (probs ``[N, E]``, weights ``[N, k]``, expert ids ``[N, k]``).

        probs and weights are at least fp32.
        """
        logits = self.router(tokens)
        # Routing decisions are sensitive to rounding: softmax in at least fp32.
        probs = torch.softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.normalize_top_k:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return probs, weights, chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        tokens = x.reshape(-1, self.dim_model)
        probs, weights, chosen = self.route(tokens)
        assigned = chosen.flatten()  # [N * k]: assignment n * k + j is token n's j-th expert
        # Assignments grouped by expert, in token order within an expert (a stable sort), so that each
        # token's contributions are added in expert order, as a loop over the experts would.
        order = assigned.argsort(stable=True)
        token_idx = order // self.top_k
        counts = torch.bincount(assigned, minlength=self.num_experts)
        rows = self.experts(tokens[token_idx], counts)
        rows = rows * weights.flatten()[order, None].to(tokens.dtype)
        out = torch.zeros_like(tokens).index_add(0, token_idx, rows)
        self.expert_counts = counts.detach()
        fraction = counts.to(probs.dtype) / chosen.numel()
        self.aux_loss = self.num_experts * (fraction * probs.mean(dim=0)).sum()
        return out.reshape(x.shape)


class Experts(nn.Module):
    """A bank of experts, each a child named by its index (``"0"`` .. ``"E-1"``), as a ModuleList names
    them, so state dicts read ``experts.3.up_proj.weight``.

    ``forward(rows, counts)``: rows ``[M, d]`` grouped by expert in the order of the experts held,
    counts ``[len(self)]`` rows per expert -> ``[M, d]``, each expert applied to its rows. Expert
    parallel keeps a subset with :meth:`keep`; the kept experts keep their single-process names.

    Plain bias-free MLP and GLU experts run as one grouped GEMM per projection where torch's fast
    kernel serves the input, and in a loop over the experts elsewhere
    (components/feedforward/grouped_experts.py). ``grouped``: ``None`` chooses so, ``True`` groups
    plain experts, biased ones too, wherever torch's grouped kernel runs, ``False`` always loops.
    """

    def __init__(self, experts: list[nn.Module]) -> None:
        super().__init__()
        for index, expert in enumerate(experts):
            self.add_module(str(index), expert)
        self.grouped: bool | None = None

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._modules.values())

    def __getitem__(self, index: int) -> nn.Module:
        """The expert of single-process index ``index`` (KeyError if this bank does not hold it)."""
        return self._modules[str(index)]

    def indices(self) -> list[int]:
        """The single-process indices of the experts held, in order."""
        return [int(name) for name in self._modules]

    def keep(self, indices: Sequence[int]) -> None:
        """Drop every expert whose index is not in ``indices``."""
        for name in [n for n in self._modules if int(n) not in set(indices)]:
            del self._modules[name]

    def forward(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if counts.numel() != len(self):
            raise ValueError(f"counts has {counts.numel()} entries for {len(self)} experts")
        experts = list(self)
        if use_grouped_mm(experts, rows, self.grouped):
            return grouped_experts_forward(experts, rows, counts)
        chunks = rows.split(counts.tolist())
        return torch.cat([expert(chunk) for expert, chunk in zip(experts, chunks, strict=True)])
