"""Library messages go through ``logging`` (loggers under ``brickwork``); the command line shows them.

A library only creates loggers: an application that imports brickwork decides where INFO messages
go (Python shows none by default). ``brickwork`` the command sends them to stdout, one plain line
each, through ``tqdm.write`` so that they print above a progress bar instead of through it.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from tqdm import tqdm


class TqdmHandler(logging.Handler):
    """Writes each record on its own line above any active tqdm bar, on ``stream`` (None: stdout as it
    is at the time, which is what pytest's capture replaces)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__()
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream or sys.stdout)
        except Exception:  # logging's contract: a failing handler reports, never raises
            self.handleError(record)


def show_messages(stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Print the ``brickwork`` loggers' messages at ``level`` and above on ``stream`` (None: stdout);
    calling it again changes the stream."""
    root = logging.getLogger("brickwork")
    root.setLevel(level)
    for handler in root.handlers:
        if isinstance(handler, TqdmHandler):
            handler.stream = stream
            break
    else:
        handler = TqdmHandler(stream)
        handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(handler)
    # The command line is the application here: its lines are not repeated by a root handler.
    root.propagate = False
