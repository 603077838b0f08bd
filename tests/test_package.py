"""The package, its error type and the registry helper."""

import functools
import subprocess
import sys

import pytest
from torch import nn

import brickwork
from brickwork.errors import ConfigError
from brickwork.registry import Registry


def test_version_and_no_generic_top_level_names() -> None:
    assert isinstance(brickwork.__version__, str) and brickwork.__version__
    names = "('components', 'factory', 'kernels', 'blocks', 'parallel', 'benchmarks')"
    code = f"import importlib.util as u; print([n for n in {names} if u.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "[]"


def test_config_error_names_path_choices_and_closest() -> None:
    err = ConfigError(
        "unknown attention 'scaled_dot_prodct'",
        "decoder.block.attention.name",
        choices=["local", "scaled_dot_product"],
        got="scaled_dot_prodct",
    )
    assert isinstance(err, ValueError)
    text = str(err)
    assert text.startswith("decoder.block.attention.name: ")
    assert "allowed: local, scaled_dot_product" in text
    assert "did you mean 'scaled_dot_product'?" in text
    assert str(err.at("model")).startswith("model.decoder.block.attention.name: ")


class _Base(nn.Module):
    def __init__(self, width: int = 1) -> None:
        super().__init__()
        self.width = width


def test_registry_rejects_duplicates_and_wrong_bases() -> None:
    reg: Registry[_Base] = Registry("thing", _Base)

    @reg.register("a")
    class A(_Base):
        pass

    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", A)
    with pytest.raises(TypeError, match="must subclass _Base"):
        reg.register("b", nn.Linear)
    with pytest.raises(ConfigError, match="allowed: a; did you mean 'a'"):
        reg.get("aa", "x.name")
    assert reg.names() == ["a"] and "a" in reg and len(reg) == 1


def test_registry_build_accepts_name_class_partial_and_instance() -> None:
    reg: Registry[_Base] = Registry("thing", _Base)
    reg.register("base", _Base)
    assert reg.build("base", width=3).width == 3
    assert reg.build(_Base, width=4).width == 4
    assert reg.build(functools.partial(_Base, width=5)).width == 5
    inst = _Base(6)
    assert reg.build(inst) is inst
    with pytest.raises(ConfigError, match=r"x\.y: thing must be a registered name"):
        reg.build(42, "x.y")


def test_registry_unregister_removes_a_name() -> None:
    reg: Registry[_Base] = Registry("thing", _Base)
    reg.register("a", _Base)
    assert reg.unregister("a") is _Base and "a" not in reg
    with pytest.raises(KeyError, match="'a' is not registered"):
        reg.unregister("a")
