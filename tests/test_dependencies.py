"""pyproject.toml keeps ranges with a lower bound each; constraints.txt pins versions inside them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        texts += extra
    return [Requirement(text) for text in texts]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_every_dependency_declares_the_lower_bound_make_test_oldest_installs() -> None:
    spec = importlib.util.spec_from_file_location("lower_bounds", ROOT / "scripts" / "lower_bounds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lines = module.lower_bounds(ROOT / "pyproject.toml")
    requirements = _requirements()
    assert len(lines) == len(requirements)
    for line, requirement in zip(lines, requirements):
        bound = next(s.version for s in requirement.specifier if s.operator == ">=")
        assert re.match(rf"{re.escape(requirement.name)}=={re.escape(bound)}(;|$)", line), line


def test_every_pin_is_exact_and_inside_the_declared_range() -> None:
    pins = _pins()
    for requirement in _requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} has no pin in constraints.txt"
        assert requirement.specifier.contains(pins[name]), (requirement, pins[name])
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.]*", version) for version in pins.values()), pins
