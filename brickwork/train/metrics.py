"""``metrics.jsonl`` (one JSON record per line), the trackers of ``train.log_to`` fed beside it
(brickwork/train/trackers/), and the ``loss.png`` plot drawn from it. Both files are rewritten whole
or not at all (atomic_file.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from brickwork.errors import ConfigError
from brickwork.train.atomic_file import replacing
from brickwork.train.trackers import Tracker


class MetricsLog:
    """Appends records to ``RUN/metrics.jsonl``.

    Training records carry ``step``, ``loss``, ``lr``, ``tokens_per_s`` and ``mfu`` (null where it is
    unknown: brickwork/train/mfu.py); evaluation records carry ``step`` and ``val_loss``. The file is
    standard JSON: a non-finite number is written as null. A crash can cut the last line off
    mid-write; reading leaves it out, and a resume drops it. Every record also goes to each of
    ``trackers`` (TensorBoard, W&B, ...), which ``close`` closes.
    """

    def __init__(self, path: Path, trackers: Sequence[Tracker] = ()) -> None:
        self.path = path
        self.trackers = list(trackers)
        self._file: TextIO | None = None

    def append(self, record: dict[str, Any]) -> None:
        # Opened once and flushed after every record: the file is as complete as before at every step,
        # without an open and a close per step (about 0.15 ms each time right after a small CPU step).
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed by close())
        self._file.write(json.dumps(_finite(record), allow_nan=False) + "\n")
        self._file.flush()
        for tracker in self.trackers:
            tracker.log(_finite(record))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for tracker in self.trackers:
            tracker.close()

    def read(self) -> list[dict[str, Any]]:
        """Every record. A last line cut off by a crash mid-write (not a whole JSON record) is left out
        (:meth:`truncate_after` drops it); any other line that is not a JSON record raises ConfigError
        naming the file and line."""
        return self._parse()[0]

    def truncate_after(self, step: int) -> str | None:
        """Drop records past ``step`` (all of them for a step below 0): a resumed run writes them again,
        so the curve has no duplicates. A torn last line is dropped too, and returned so that the caller
        can say so. The file is replaced whole: a full disk leaves it as it was (RewriteError)."""
        records, torn = self._parse()
        kept = [r for r in records if r["step"] <= step]
        if self._file is not None:  # it would go on appending to the file replaced
            self._file.close()
            self._file = None
        with replacing(self.path) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
        return torn

    def _parse(self) -> tuple[list[dict[str, Any]], str | None]:
        if not self.path.exists():
            return [], None
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"{self.path} cannot be read: {err}", "--resume") from None
        lines = text.splitlines()
        records = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                    raise ValueError("not a record with an integer step")
            except ValueError as err:
                if number == len(lines):
                    return records, line
                raise ConfigError(
                    f"{self.path} line {number} is not a metrics record ({err}): {line[:80]!r}", "--resume"
                ) from None
            records.append(record)
        return records, None


def _finite(record: dict[str, Any]) -> dict[str, Any]:
    # JSON has no Infinity or NaN; strict readers reject the tokens Python would write for them.
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}


def plot_losses(records: list[dict[str, Any]], path: Path, title: str) -> bool:
    """Draw train and validation loss against step into ``path``; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    train = [(r["step"], r["loss"]) for r in records if r.get("loss") is not None]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    if train:
        ax.plot(*zip(*train), color="tab:blue", alpha=0.55, linewidth=1, label="train")
    if val:
        ax.plot(*zip(*val), color="tab:orange", marker="o", markersize=3.5, label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        with replacing(path) as tmp:
            fig.savefig(tmp)
    finally:
        plt.close(fig)
    return True
