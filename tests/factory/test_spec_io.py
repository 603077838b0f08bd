"""load_spec / dump_spec: safe YAML and JSON, byte-stable round trips, strict parsing."""

import pytest
import yaml
from factory_specs import TINY_SPECS

from brickwork.factory import ConfigError, build_model, dump_spec, load_spec, parse_spec


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
@pytest.mark.parametrize("kind", sorted(TINY_SPECS))
def test_dump_load_dump_is_byte_identical(tmp_path, suffix: str, kind: str) -> None:
    resolved = build_model(TINY_SPECS[kind]()).spec
    first = tmp_path / f"a{suffix}"
    second = tmp_path / f"b{suffix}"
    text = dump_spec(resolved, first)
    loaded = load_spec(first)
    assert dump_spec(loaded, second) == text
    assert first.read_bytes() == second.read_bytes()
    assert build_model(loaded).spec == resolved


def test_yaml_keeps_types(tmp_path) -> None:
    path = tmp_path / "s.yaml"
    dump_spec({"eps": 1e-5, "n": 3, "flag": True, "none": None, "layers": {3: {"x": [1, 2]}}}, path)
    assert load_spec(path) == {"eps": 1e-5, "n": 3, "flag": True, "none": None, "layers": {3: {"x": [1, 2]}}}


def test_an_exponent_without_a_dot_is_a_number() -> None:
    # YAML 1.1 reads these as text; a spec (and an override, which shares the loader) means the number.
    text = "a: 1e-5\nb: 5E+2\nc: -.5e1\nd: '1e-5'\ne: 1.5e\nf: 12\n"
    assert parse_spec(text, "yaml") == {"a": 1e-5, "b": 500.0, "c": -5.0, "d": "1e-5", "e": "1.5e", "f": 12}
    assert yaml.safe_load("a: 1e-5") == {"a": "1e-5"}  # the global safe loader is left as it was


def test_yaml_is_read_safely() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_spec("a: !!python/object/apply:os.system ['true']", "yaml")


def test_duplicate_keys_are_errors_not_last_wins() -> None:
    with pytest.raises(ConfigError, match=r"^decoder\.num_layers: key given twice in <spec> \(line 3\)"):
        parse_spec("decoder:\n  num_layers: 2\n  num_layers: 4\n", "yaml")
    with pytest.raises(ConfigError, match="key 'a' given twice"):
        parse_spec('{"a": 1, "a": 2}', "json")


@pytest.mark.parametrize(
    ("text", "fmt", "fragment"),
    [
        ("[1, 2]", "yaml", "mapping at the top level"),
        ("a: [1", "yaml", "not valid YAML"),
        ("{", "json", "not valid JSON"),
        ("a: 1", "toml", "unknown spec format"),
    ],
)
def test_malformed_text(text: str, fmt: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        parse_spec(text, fmt)


def test_unwritable_values_and_suffixes(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^a\.b: cannot write a object"):
        dump_spec({"a": {"b": object()}}, tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match="NaN"):
        dump_spec({"a": float("nan")}, tmp_path / "x.json")
    with pytest.raises(ConfigError, match=r"suffix '\.toml'"):
        dump_spec({"a": 1}, tmp_path / "x.toml")
    with pytest.raises(ConfigError, match=r"allowed: \.json, \.yaml, \.yml"):
        load_spec(tmp_path / "x.txt")
