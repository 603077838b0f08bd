"""Per-part strategies (``dist.parts``): replicated parts stay whole, split parts shard, same numbers."""

from __future__ import annotations

import pytest
import torch
from parts_cases import AnnotatedLM, annotated_rank, build, build_vit, tp2_with_parts, train, vit_split_head
from torch import nn

from brickwork.errors import ConfigError
from brickwork.parallel import ParallelConfig, part, spawn
from brickwork.parallel.tensor.parts import annotated_parts, whole_modules


def test_the_innermost_named_module_decides_and_a_later_pattern_wins() -> None:
    whole = whole_modules(build(), {"layers.*": "replicate", "layers.1": "split"})
    assert "layers.0" in whole and "layers.0.attention.q_proj" in whole
    assert not any(name.startswith("layers.1") for name in whole)
    assert "lm_head" not in whole and "token_embedding" not in whole
    whole = whole_modules(build(), {"layers.*": "replicate", "layers.1.feedforward": "split"})
    assert "layers.1.attention.q_proj" in whole and "layers.1.feedforward" not in whole


def test_unknown_strategy_names_the_key() -> None:
    with pytest.raises(ConfigError, match="unknown part strategy 'shard'") as caught:
        ParallelConfig.from_dict({"tensor_parallel_size": 2, "parts": {"layers.*": "shard"}})
    assert "parts.layers.*" in str(caught.value) and "replicate" in str(caught.value)


def test_a_pattern_naming_no_module_names_the_key() -> None:
    # Components are matched whole: "layers" alone, or a path one level too deep, names nothing.
    for pattern in ("blocks.*", "layers.0.q_proj"):
        with pytest.raises(ConfigError, match="matches no module") as caught:
            whole_modules(build(), {pattern: "replicate"})
        assert f"parts.{pattern}" in str(caught.value)


@pytest.mark.parametrize(
    ("dist", "message"),
    [
        ({"tensor_parallel_size": 2, "parts": ["layers.0"]}, "must be a dict"),
        ({"pipeline_parallel_size": 2, "parts": {"layers.0": "replicate"}}, "not supported under a pipeline"),
        (
            {"tensor_parallel_size": 2, "sequence_parallel": True, "parts": {"layers.0": "replicate"}},
            "sequence-parallel",
        ),
    ],
)
def test_unsupported_combinations_are_refused(dist: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ParallelConfig.from_dict(dist)


def test_parts_round_trip_through_the_resolved_dict() -> None:
    config = ParallelConfig.from_dict({"tensor_parallel_size": 2, "parts": {"layers.0": "replicate"}})
    assert config.to_dict()["parts"] == {"layers.0": "replicate"}
    assert ParallelConfig.from_dict(config.to_dict()) == config


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_replicated_and_split_parts_train_like_one_process() -> None:
    ref_losses, ref_state = train(build())
    for losses, state, sharded in spawn(tp2_with_parts, 2, timeout=200):
        # The replicated block keeps all 4 heads and its full weights; the split one holds 2 heads.
        assert sharded.pop("heads") == (4, 2)
        assert not sharded["token_embedding.weight"] and not sharded["layers.0.attention.q_proj.weight"]
        assert sharded["layers.1.attention.q_proj.weight"] and sharded["lm_head.weight"]
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
        for name, value in ref_state.items():
            torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_a_wide_classifier_split_over_a_replicated_body_trains_like_one_process() -> None:
    ref_losses, ref_state = train(build_vit(), "image_classification")
    for losses, state, split in spawn(vit_split_head, 2, timeout=200):
        assert split
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
        for name, value in ref_state.items():
            torch.testing.assert_close(state[name], value, rtol=1e-5, atol=1e-5, msg=name)


def test_a_part_block_marks_what_is_assigned_inside_it_and_the_innermost_block_decides() -> None:
    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            with part("replicate"):
                self.body = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
                with part("split"):
                    self.inner = nn.Linear(2, 2)
            self.after = nn.Linear(2, 2)

    marked = annotated_parts(Model())
    assert marked == {"body": "replicate", "body.0": "replicate", "body.1": "replicate", "inner": "split"}
    assert annotated_parts(Model()) == marked  # the blocks leave nothing behind them


def test_the_dist_dict_wins_over_annotations_at_and_inside_what_it_names() -> None:
    model = AnnotatedLM()
    assert {"token_embedding", "layers.0.attention", "layers.0.attention.q_proj"} <= whole_modules(model, {})
    assert "lm_head" not in whole_modules(model, {}) and "layers.1.attention" not in whole_modules(model, {})
    whole = whole_modules(model, {"layers.0": "split", "lm_head": "replicate"})
    assert "token_embedding" in whole and "lm_head" in whole
    assert not any(name.startswith("layers.0") for name in whole)


def test_an_unknown_part_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match="unknown part strategy 'shard'") as caught, part("shard"):
        pass
    assert "replicate" in str(caught.value)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_annotated_parts_train_like_one_process() -> None:
    ref_losses, ref_state = train(AnnotatedLM())
    for rank in spawn(annotated_rank, 2, timeout=200):
        assert rank["heads"] == (4, 2)
        sharded = rank["sharded"]
        assert not sharded["token_embedding.weight"] and not sharded["layers.0.attention.q_proj.weight"]
        assert sharded["layers.1.attention.q_proj.weight"] and sharded["lm_head.weight"]
        torch.testing.assert_close(
            torch.tensor(rank["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6
        )
        for name, value in ref_state.items():
            torch.testing.assert_close(rank["state"][name], value, rtol=1e-5, atol=1e-5, msg=name)
        assert (
            "part annotation" in rank["sequence_parallel"]
            and "sequence-parallel" in rank["sequence_parallel"]
        )
        assert "part annotation" in rank["pipeline"] and "pipeline" in rank["pipeline"]
