"""Property: a mutated valid spec either builds or raises ConfigError naming the mutated key path.

Mutations: an unknown key inserted at any depth, a registry name changed, a value replaced by one of
another type, a number changed. Nothing but ConfigError may escape.
"""

import copy
from typing import Any

import pytest
from factory_specs import TINY_SPECS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from brickwork.components.attention import ATTENTION_REGISTRY
from brickwork.components.feedforward import FEEDFORWARD_REGISTRY
from brickwork.components.positional import POSITIONAL_REGISTRY
from brickwork.components.residual import NORM_REGISTRY, RESIDUAL_REGISTRY
from brickwork.factory import ConfigError, build_model

REGISTRIES = (ATTENTION_REGISTRY, FEEDFORWARD_REGISTRY, POSITIONAL_REGISTRY, NORM_REGISTRY, RESIDUAL_REGISTRY)
NAMES = sorted({n for r in REGISTRIES for n in r.names()} | {"none", "bogus"})
OTHER_TYPES = st.sampled_from(["text", [1, 2], {"k": 1}, None, True, 2.5, -7])


def nodes(value: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """Every (path, value) in a spec, the root included."""
    out = [(path, value)]
    if isinstance(value, dict):
        for key, child in value.items():
            out += nodes(child, (*path, key))
    return out


def set_at(spec: dict[str, Any], path: tuple, value: Any) -> None:
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path)


@st.composite
def mutations(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    """(mutated spec, the path the error must name, the kind of mutation)."""
    spec = TINY_SPECS[draw(st.sampled_from(sorted(TINY_SPECS)))]()
    everything = nodes(spec)
    kind = draw(st.sampled_from(["unknown_key", "name", "type", "value"]))
    if kind == "unknown_key":
        path, _ = draw(st.sampled_from([n for n in everything if isinstance(n[1], dict)]))
        key = draw(st.sampled_from(["zz_unknown", "num_head", "dropuot", "Name"]))
        set_at(spec, (*path, key), draw(OTHER_TYPES)) if path else spec.update({key: 1})
        return spec, dotted((*path, key)), kind
    leaves = [n for n in everything if n[0] and not isinstance(n[1], dict)]
    if kind == "name":
        names = [n for n in leaves if n[0][-1] == "name"] or leaves
        path, _ = draw(st.sampled_from(names))
        set_at(spec, path, draw(st.sampled_from(NAMES)))
        # A new component may reject its predecessor's options: any key of that choice may be named.
        return spec, dotted(path[:-1]), kind
    path, old = draw(st.sampled_from(leaves))
    if kind == "type":
        new = draw(OTHER_TYPES.filter(lambda v: type(v) is not type(old)))
    elif isinstance(old, bool) or not isinstance(old, (int, float)):
        new = draw(st.sampled_from(["", "x", "gelu"])) if isinstance(old, str) else (not old)
    elif isinstance(old, int):
        new = draw(st.integers(-3, 40))
    else:
        new = draw(st.floats(-1.0, 2.0, allow_nan=False))
    set_at(spec, path, new)
    return spec, dotted(path), kind


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations())
def test_mutated_specs_build_or_name_the_mutated_path(case: tuple[dict[str, Any], str, str]) -> None:
    spec, path, kind = case
    before = copy.deepcopy(spec)
    try:
        build_model(spec)
    except ConfigError as err:
        assert path in str(err), f"{kind} mutation at {path!r}, but: {err}"
        if kind == "unknown_key":
            assert err.path == path
    assert spec == before


def test_a_derived_head_size_too_small_for_rotary_names_dim_model() -> None:
    # dim_head comes from dim_model / num_heads here, so the error must point at the key to change.
    spec = {
        "model": "decoder_lm", "vocab_size": 30, "dim_model": 2, "max_seq_len": 12, "position": "rotary",
        "decoder": {"num_layers": 1, "block": {"attention": {"num_heads": 2}}},
    }  # fmt: skip
    with pytest.raises(
        ConfigError, match=r"dim_head=1 is dim_model=2 / decoder\.block\.attention\.num_heads=2"
    ) as error:
        build_model(spec)
    assert error.value.path == "position.fraction"
