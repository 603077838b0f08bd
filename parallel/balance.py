"""Stage balancing: how many layers each pipeline stage gets, and each data-parallel rank's rows.

Cost of a layer, per token of a training step (forward + backward, in multiply-adds × 2):

- ``6 × parameters``: every weight takes part in one matmul forward and two backward;
- ``12 × T × H × D`` (``× ½`` when causal) for each attention module (a module with integer
  ``num_heads`` and ``dim_head``): the scores ``QKᵀ`` and ``softmax · V`` are activation-by-activation
  matmuls that no parameter count shows, ``T × H × D`` multiply-adds each per query forward, so
  ``4 × T × H × D`` FLOPs, and twice that backward. ``T`` is the model's ``max_seq_len`` (or
  ``seq_len``), capped by a mechanism's ``window_size``.

The first stage also carries the embedding (a lookup: no matmul, cost 0) and the last the head
(``6 × its parameters``). Stage *s* with relative speed ``w[s]`` takes ``cost / w[s]`` time; the split
is the contiguous one that minimizes the slowest stage's time, found exactly by dynamic programming
over (layers, stages). Data-parallel weights split the rows of a batch in proportion (largest
remainders), every rank keeping at least one row.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from torch import nn

from brickwork.errors import ConfigError


def module_cost(module: nn.Module, seq_len: int) -> float:
    """Estimated training FLOPs per token of ``module`` (see the module docstring)."""
    cost = 6.0 * sum(p.numel() for p in module.parameters())
    for sub in module.modules():
        heads, dim_head = getattr(sub, "num_heads", None), getattr(sub, "dim_head", None)
        if isinstance(heads, int) and isinstance(dim_head, int):
            window = getattr(getattr(sub, "mechanism", None), "window_size", None)
            span = min(seq_len, window) if isinstance(window, int) and window > 0 else seq_len
            causal = 0.5 if getattr(sub, "causal", False) else 1.0
            cost += 12.0 * span * heads * dim_head * causal
    return cost


def layer_costs(layers: Sequence[nn.Module], seq_len: int) -> list[float]:
    """``module_cost`` of each layer."""
    return [module_cost(layer, seq_len) for layer in layers]


def split_stages(
    costs: Sequence[float],
    num_stages: int,
    weights: Sequence[float] | None = None,
    first_extra: float = 0.0,
    last_extra: float = 0.0,
) -> tuple[int, ...]:
    """Layers per stage: the contiguous split of ``costs`` minimizing max over stages of cost / weight.

    ``weights`` (default all 1) are the stages' relative speeds; ``first_extra`` / ``last_extra`` are
    costs the first / last stage carry besides their layers (embedding, head). Every stage gets at
    least one layer. Ties go to the split that puts more layers early (deterministic on every rank).
    """
    n = len(costs)
    if num_stages < 1 or n < num_stages:
        raise ConfigError(f"{n} layers cannot fill {num_stages} pipeline stages (each needs at least one)")
    speed = list(weights) if weights is not None else [1.0] * num_stages
    if len(speed) != num_stages or any(w <= 0 for w in speed):
        raise ConfigError(f"need {num_stages} positive stage weights, got {list(speed)}", "device_weights")
    prefix = list(itertools.accumulate(costs, initial=0.0))

    def time(stage: int, start: int, end: int) -> float:
        extra = (first_extra if stage == 0 else 0.0) + (last_extra if stage == num_stages - 1 else 0.0)
        return (prefix[end] - prefix[start] + extra) / speed[stage]

    inf = float("inf")
    # best[s][i]: the smallest slowest-stage time for the first i layers on stages 0..s-1.
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, n - (num_stages - s) + 1):
            for j in range(i - 1, s - 2, -1):
                value = max(best[s - 1][j], time(s - 1, j, i))
                if value < best[s][i]:
                    best[s][i], cut[s][i] = value, j
    counts, end = [], n
    for s in range(num_stages, 0, -1):
        start = cut[s][end]
        counts.append(end - start)
        end = start
    return tuple(reversed(counts))


def split_rows(batch: int, weights: Sequence[float] | None, parts: int) -> tuple[int, ...]:
    """Rows of a batch of ``batch`` for each of ``parts`` data-parallel ranks, in proportion to
    ``weights`` (equal parts when None, then ``batch`` must divide)."""
    if weights is None:
        if batch % parts:
            raise ValueError(f"batch size {batch} is not divisible by data_parallel_size={parts}")
        return (batch // parts,) * parts
    if batch < parts:
        raise ValueError(f"batch size {batch} is smaller than data_parallel_size={parts}")
    total = float(sum(weights))
    exact = [batch * w / total for w in weights]
    rows = [max(1, int(e)) for e in exact]
    # Largest remainders first, then take back from the largest shares if the floor of 1 overshot.
    order = sorted(range(parts), key=lambda r: exact[r] - int(exact[r]), reverse=True)
    k = 0
    while sum(rows) < batch:
        rows[order[k % parts]] += 1
        k += 1
    while sum(rows) > batch:
        rows[rows.index(max(rows))] -= 1
    return tuple(rows)
