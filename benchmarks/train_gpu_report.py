"""What the GPU training benchmark derives from its rows: the ratios between rows, the issue's targets
met or not, and the Markdown table.

Ratios are of tokens/s: each brickwork row (``brickwork``, ``cli``) over the ``plain`` row of the same
shape and mode (``x_plain``), each compiled row over the eager row of the same shape and
implementation (``compiled_x_eager``), and on CUDA each brickwork row's peak memory over that of the
shape's plain compiled row (``memory_x_plain_compiled``); each ``fp8`` row over the bf16
``brickwork`` row of the same shape and mode (``x_bf16``); each ``packed`` row over that row too
(``x_unpacked``).
"""

from __future__ import annotations

from dataclasses import dataclass


def succeeded(row: dict) -> bool:
    return "error" not in row


def add_ratios(rows: list[dict]) -> None:
    """Set each row's ratios (module docstring) where both rows of the ratio succeeded."""
    index = {(r["shape"], r["implementation"], r["mode"]): r for r in rows if succeeded(r)}
    for row in index.values():
        shape, implementation, mode = row["shape"], row["implementation"], row["mode"]
        plain = index.get((shape, "plain", mode))
        if implementation != "plain" and plain is not None:
            row["x_plain"] = row["tokens_per_s"] / plain["tokens_per_s"]
        bf16 = index.get((shape, "brickwork", mode))
        if implementation in ("fp8", "packed") and bf16 is not None:
            key = "x_bf16" if implementation == "fp8" else "x_unpacked"
            row[key] = row["tokens_per_s"] / bf16["tokens_per_s"]
        eager = index.get((shape, implementation, "eager"))
        if mode == "compiled" and eager is not None:
            row["compiled_x_eager"] = row["tokens_per_s"] / eager["tokens_per_s"]
        plain_compiled = index.get((shape, "plain", "compiled"))
        if implementation != "plain" and plain_compiled is not None and "peak_gib" in row:
            row["memory_x_plain_compiled"] = row["peak_gib"] / plain_compiled["peak_gib"]


@dataclass(frozen=True)
class Target:
    """A bound on one ratio of every row of the given families, implementations and modes."""

    text: str
    families: tuple[str, ...]
    implementations: tuple[str, ...]
    modes: tuple[str, ...]
    ratio: str
    bound: float
    at_least: bool = True

    def covers(self, row: dict) -> bool:
        return (row["family"], row["implementation"], row["mode"]) in {
            (f, i, m) for f in self.families for i in self.implementations for m in self.modes
        }

    def met(self, value: float) -> bool:
        return value >= self.bound if self.at_least else value <= self.bound


TARGETS = (
    Target("brickwork train compiled >= 1.05x plain compiled", ("gpt2",), ("cli",), ("compiled",),
           "x_plain", 1.05),
    Target("brickwork model compiled, bare loop >= 1.0x plain compiled", ("gpt2", "llama"), ("brickwork",),
           ("compiled",), "x_plain", 1.0),
    Target("eager brickwork >= 1.4x plain eager", ("gpt2", "llama"), ("brickwork", "cli"), ("eager",),
           "x_plain", 1.4),
    Target("brickwork peak memory <= plain compiled's", ("gpt2", "llama"), ("brickwork", "cli"),
           ("eager", "compiled"), "memory_x_plain_compiled", 1.0, at_least=False),
)  # fmt: skip


def verdicts(rows: list[dict], judged: bool) -> list[dict]:
    """One line per target and row it covers: the ratio, the bound, and ``met`` (None where the
    targets are not ``judged``, as on a CPU or at the tiny shapes, or the ratio is missing)."""
    out = []
    for target in TARGETS:
        for row in rows:
            if not target.covers(row):
                continue
            value = row.get(target.ratio)
            met = target.met(value) if judged and value is not None else None
            out.append({"target": target.text, "row": row["row"], "ratio": target.ratio, "value": value,
                        "bound": target.bound, "met": met})  # fmt: skip
    return out


def _cell(value: float | None, form: str) -> str:
    return "-" if value is None else format(value, form)


def markdown(metadata: dict, rows: list[dict], lines: list[dict]) -> str:
    """The rows and the targets as Markdown tables, with the run's settings above them."""
    head = ["row", "tokens/s", "step ms", "MFU", "peak GiB", "x plain", "x bf16", "x unpacked",
            "compiled / eager", "first loss", "warm-up s", "wall s"]  # fmt: skip
    out = [
        f"# Training step on {metadata['device']}: brickwork against plain loops",
        "",
        f"{metadata['timestamp']}; torch {metadata['torch']}; {metadata['scale']} shapes, "
        f"{metadata['precision']}; {metadata['warmup']} warm-up and {metadata['steps']} timed steps a row "
        "(brickwork train: the logged rates whose 20-step window lies past the warm-up). "
        f"MFU: {metadata['mfu_convention']}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        if not succeeded(r):
            out.append(f"| {r['row']} | failed: {r['error'][:200]} |" + " |" * (len(head) - 2))
            continue
        cells = [r["row"], _cell(r["tokens_per_s"], ",.0f"), _cell(r["step_ms"], ".1f"),
                 _cell(r.get("mfu"), ".1%"), _cell(r.get("peak_gib"), ".2f"), _cell(r.get("x_plain"), ".2f"),
                 _cell(r.get("x_bf16"), ".2f"), _cell(r.get("x_unpacked"), ".2f"),
                 _cell(r.get("compiled_x_eager"), ".2f"),
                 _cell(r["first_loss"], ".3f"), _cell(r.get("warmup_s"), ".1f"),
                 _cell(r["wall_s"], ".1f")]  # fmt: skip
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "| target | row | ratio | met |", "|---|---|---|---|"]
    for line in lines:
        met = {True: "yes", False: "**no**", None: "n/a"}[line["met"]]
        out.append(f"| {line['target']} | {line['row']} | {_cell(line['value'], '.2f')} | {met} |")
    if metadata.get("mfu_unknown"):
        out += ["", f"MFU unknown: {metadata['mfu_unknown']}."]
    if not metadata["targets_judged"]:
        out += ["", "The targets are judged on CUDA at the full shapes only."]
    return "\n".join(out) + "\n"
