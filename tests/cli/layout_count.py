"""``python -m layout_count FILE ARGS...`` runs ``brickwork ARGS...`` and writes to ``FILE.<rank>`` how
many :class:`ParallelConfig` objects this process built (every construction goes through ``__init__``:
``from_dict``'s and ``dataclasses.replace``'s alike). Launched by tests/cli/test_layout_resolved_once.py,
alone or under torchrun."""

from __future__ import annotations

import sys
from pathlib import Path

from brickwork import launch_env
from brickwork.cli import main
from brickwork.parallel.config import ParallelConfig

built = 0
_init = ParallelConfig.__init__


def _counting_init(self: ParallelConfig, *args: object, **kwargs: object) -> None:
    global built
    built += 1
    _init(self, *args, **kwargs)


ParallelConfig.__init__ = _counting_init  # type: ignore[method-assign]
out, rank = sys.argv[1], launch_env.rank()  # the rank before the run tears its process group down
code = main(sys.argv[2:])
Path(f"{out}.{rank}").write_text(str(built))
sys.exit(code)
