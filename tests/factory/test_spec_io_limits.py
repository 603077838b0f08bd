"""The spec loader's bounds: linear time on alias bombs, no RecursionError, files named in errors."""

from __future__ import annotations

import json
import time

import pytest

from brickwork.factory import ConfigError, load_spec, parse_spec
from brickwork.factory.spec_io import MAX_DEPTH, MAX_EXPANDED_NODES


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """Each level lists the previous one ``width`` times: ``width ** levels`` values from ~500 bytes."""
    lines = ["a0: &a0 [" + ", ".join(['"lol"'] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_the_alias_bomb_is_a_config_error_in_under_a_second() -> None:
    text = alias_bomb()
    assert len(text.encode()) < 600
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=r"expands to more than 100,000 values, counting an alias's"):
        parse_spec(text, "yaml", source="bomb.yaml")
    assert time.perf_counter() - started < 1.0


def test_aliases_within_the_bound_load_and_duplicates_inside_them_are_still_found() -> None:
    # 9 ** 4 = 6561 values: shared, legal, and read in one walk.
    data = parse_spec(alias_bomb(levels=4), "yaml")
    assert data["a3"][0][0][0] == ["lol"] * 9
    with pytest.raises(ConfigError, match=r"base\.x: key given twice"):
        parse_spec("base: &b {x: 1, x: 2}\nb: *b\n", "yaml")
    assert MAX_EXPANDED_NODES > 9**4


def test_a_self_referencing_alias_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="an alias that refers to itself"):
        parse_spec("a: &a [1, *a]\n", "yaml", source="self.yaml")


@pytest.mark.parametrize(
    ("fmt", "text"), [("json", "[" * 100_000 + "]" * 100_000), ("yaml", "[" * 100_000 + "]" * 100_000)]
)
def test_100k_deep_nesting_is_a_config_error_not_a_recursion_error(fmt: str, text: str) -> None:
    with pytest.raises(ConfigError, match="nests"):
        parse_spec(text, fmt, source=f"deep.{fmt}")


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_nesting_past_the_depth_bound_is_refused(fmt: str) -> None:
    nested: object = 1
    for _ in range(MAX_DEPTH + 2):
        nested = {"a": nested}
    with pytest.raises(ConfigError, match=f"nests more than {MAX_DEPTH} levels deep"):
        parse_spec(json.dumps({"x": nested}), fmt)


def test_a_non_utf8_file_is_named(tmp_path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes("model: décodeur\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"spec file '{path}' is not UTF-8 text \(byte 8"):
        load_spec(path)
