"""pyproject.toml keeps ranges with a lower bound each; constraints.txt pins versions inside them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from brickwork.extras import EXTRAS

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements() -> list[Requirement]:
    """Every requirement with a version range: brickwork's own extras named inside others are not."""
    project = _project()
    texts = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        texts += extra
    return [r for r in map(Requirement, texts) if r.name != "brickwork"]


def _extra_packages(extra: str) -> set[str]:
    """The packages ``pip install 'brickwork[extra]'`` brings beyond the core, its own extras followed."""
    names = set()
    for requirement in map(Requirement, _project()["optional-dependencies"][extra]):
        if requirement.name == "brickwork":
            for inner in requirement.extras:
                names |= _extra_packages(inner)
        else:
            names.add(canonicalize_name(requirement.name))
    return names


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


def test_the_core_is_what_building_training_and_sampling_need() -> None:
    core = {canonicalize_name(Requirement(text).name) for text in _project()["dependencies"]}
    assert core == {"torch", "numpy", "pyyaml", "safetensors", "tqdm"}


def test_each_optional_package_is_in_the_extra_its_error_names_and_dev_holds_them_all() -> None:
    extras = _project()["optional-dependencies"]
    for package, extra in EXTRAS.items():
        assert package in _extra_packages(extra), (package, extra)
        assert package in _extra_packages("dev"), package
    assert _extra_packages("bench") == _extra_packages("hf") | _extra_packages("plot")
    assert set(EXTRAS.values()) | {"bench", "dev"} == set(extras)
