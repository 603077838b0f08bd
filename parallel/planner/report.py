"""The planner's ranked table, as ``brickwork plan`` prints it."""

from __future__ import annotations

from brickwork.parallel.planner.estimate import Plan


def _gib(count: int) -> str:
    return f"{count / 1024**3:.1f}"


def plan_table(plans: list[Plan], top: int = 10) -> str:
    """A markdown table of the ``top`` plans: layout, memory per device, step time, tokens/s, TFLOP/s
    per device, MFU, and why each runner-up lost."""
    lines = [
        "| # | layout | memory / device (GiB) | step (s) | tokens/s | TFLOP/s / device | MFU "
        "| why not first |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rank, p in enumerate(plans[:top], start=1):
        lines.append(
            f"| {rank} | {p.name} | {_gib(p.memory_bytes)} of {_gib(p.device_memory_bytes)} | "
            f"{p.step_time_s:.3g} | {p.tokens_per_s:,.0f} | {p.tflops_per_device:.3g} | {p.mfu:.1%} | "
            f"{p.lost_because or 'best'} |"
        )
    if len(plans) > top:
        lines.append(f"\n{len(plans) - top} more layouts fit; they are slower still.")
    return "\n".join(lines) + "\n"
