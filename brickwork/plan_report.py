"""``brickwork plan``'s table: each layout beside the best, term by term.

A runner-up's row names every term of the step that differs from the best's (compute, recomputation,
the pipeline bubble, each kind of communication), so a 2% gap shows where the 2% goes; a tie on step
time says it was ranked by memory. The headroom column is what each device has left.
"""

from __future__ import annotations

from brickwork.parallel.planner.estimate import Plan

# (TimeBreakdown field, label): the step's terms; ``compute`` is counted without its recomputation.
TERMS = (
    ("compute", "compute"),
    ("recompute", "recompute"),
    ("bubble", "bubble"),
    ("tensor_parallel", "TP comm"),
    ("context_parallel", "CP comm"),
    ("expert_parallel", "EP comm"),
    ("pipeline", "PP sends"),
    ("data_parallel", "DP comm"),
    ("offload", "offload"),
)
# Below this share of the best step a difference is noise of the model, not a reason.
NEGLIGIBLE = 5e-4


def _gib(count: float) -> str:
    return f"{count / 1024**3:.1f}"


def _seconds(value: float) -> str:
    sign = "+" if value >= 0 else "-"
    value = abs(value)
    if value < 1e-3:
        return f"{sign}{value * 1e6:.0f} µs"
    return f"{sign}{value * 1e3:.1f} ms" if value < 1 else f"{sign}{value:.2f} s"


def _term(plan: Plan, field: str) -> float:
    if field == "compute":
        return plan.time.compute - plan.time.recompute
    return getattr(plan.time, field)


def versus_best(plan: Plan, best: Plan) -> str:
    """Why ``plan`` ranks below ``best``: its step's extra share, then every term that differs."""
    floor = NEGLIGIBLE * best.step_time_s
    gap = plan.step_time_s - best.step_time_s
    if abs(gap) < floor:
        memory = plan.memory_bytes - best.memory_bytes
        reason = f"ranked by memory: {'+' if memory >= 0 else '-'}{_gib(abs(memory))} GiB"
        return "tie on step time; " + (reason if memory else "same memory")
    terms = [(label, _term(plan, field) - _term(best, field)) for field, label in TERMS]
    shown = sorted(((label, d) for label, d in terms if abs(d) >= floor), key=lambda t: -abs(t[1]))
    rest = gap - sum(d for _, d in terms)
    if abs(rest) >= floor:  # what the terms leave: the pipeline paced by its slowest stage
        shown.append(("stage imbalance", rest))
    parts = ", ".join(f"{label} {_seconds(d)}" for label, d in shown)
    return f"+{gap / best.step_time_s:.1%}: {parts}" if parts else f"+{gap / best.step_time_s:.1%}"


def plan_table(plans: list[Plan], top: int) -> str:
    """A markdown table of the ``top`` plans, best first, each runner-up compared with the best."""
    lines = [
        "| # | layout | memory / device (GiB) | headroom (GiB) | step (s) | tokens/s | MFU | vs best |",
        "|---|---|---|---|---|---|---|---|",
    ]
    best = plans[0]
    for rank, p in enumerate(plans[:top], start=1):
        why = "best" if p is best else versus_best(p, best)
        lines.append(
            f"| {rank} | {p.name} | {_gib(p.memory_bytes)} of {_gib(p.device_memory_bytes)} | "
            f"{_gib(p.device_memory_bytes - p.memory_bytes)} | {p.step_time_s:.3g} | "
            f"{p.tokens_per_s:,.0f} | {p.mfu:.1%} | {why} |"
        )
    if len(plans) > top:
        lines.append(f"\n{len(plans) - top} more layouts fit; they are slower still.")
    return "\n".join(lines) + "\n"
