"""What every tracker offers the training loop: take a record, close at the end."""

from __future__ import annotations

from typing import Any, Protocol


class Tracker(Protocol):
    """A metrics sink. ``package`` is the module it needs, checked when ``train.log_to`` is read."""

    package: str

    def log(self, record: dict[str, Any]) -> None:
        """Take one metrics record (``step`` plus numbers, as metrics.jsonl holds it)."""

    def close(self) -> None:
        """Write out what is buffered and let go of the files."""


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of ``record`` other than its step; None (a non-finite or unknown value) is left out."""
    return {
        key: value
        for key, value in record.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }
