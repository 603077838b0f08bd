"""Print a pip constraints file pinning every dependency of pyproject.toml to its declared lower bound.

``make test-oldest`` installs from it, so each ``>=`` bound in pyproject.toml is one the suite has run on.
A dependency declared without a ``>=`` bound is left free and named on stderr.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import tomllib

LOWER_BOUND = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)\s*(?:,[^;]*)?(;.*)?$")


def lower_bounds(pyproject: Path) -> list[str]:
    """``name==bound[; marker]`` for the runtime dependencies and every optional extra."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    lines = []
    for requirement in requirements:
        match = LOWER_BOUND.match(requirement)
        if match is None:
            print(f"no lower bound to pin in {requirement!r}", file=sys.stderr)
            continue
        name, version, marker = match.groups()
        lines.append(f"{name}=={version}{marker or ''}")
    return lines


if __name__ == "__main__":
    print("\n".join(lower_bounds(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml"))))
