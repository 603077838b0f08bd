"""The dist dict: validation, LiBai's spellings, and plan checks that need no process group."""

from __future__ import annotations

import pytest
from parallel_cases import build, tiny_spec

from brickwork.errors import ConfigError
from brickwork.factory import build_model
from brickwork.parallel import ParallelConfig
from brickwork.parallel.tensor.checks import check_tensor_parallel
from brickwork.parallel.tensor.plan import component_plan, name_plan
from brickwork.parallel.tensor.styles import packed_order, parse_style, unpack_full


def test_defaults_and_world_size() -> None:
    config = ParallelConfig.from_dict({"data_parallel_size": 2, "tensor_parallel_size": 4}, world_size=8)
    assert (config.pipeline_parallel_size, config.zero_stage, config.mixed_precision) == (1, 0, "fp32")
    assert config.world_size == 8


def test_world_size_mismatch_names_every_number() -> None:
    with pytest.raises(ConfigError) as error:
        ParallelConfig.from_dict({"data_parallel_size": 2, "tensor_parallel_size": 2}, world_size=2)
    message = str(error.value)
    assert "data_parallel_size (2)" in message and "tensor_parallel_size (2)" in message
    assert "= 4, but the world size is 2" in message


def test_data_parallel_size_is_inferred_from_the_world_as_in_libai() -> None:
    assert ParallelConfig.from_dict({"tensor_parallel_size": 2}, world_size=8).data_parallel_size == 4


def test_libai_spellings_are_accepted() -> None:
    libai = {
        "data_parallel_size": 2,
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 2,
        "pipeline_num_layers": 4,
        "custom_pipeline_stage_id": [0, 0, 0, 1],
        "zero_optimization": {"enabled": True, "stage": 2},
        "activation_checkpoint": {"enabled": True},
        "amp": {"enabled": True},
        "device_type": "cpu",
    }
    config = ParallelConfig.from_dict(libai, world_size=8)
    assert config.zero_stage == 2
    assert config.activation_checkpointing == "full"
    assert config.mixed_precision == "fp16"
    assert config.pipeline_layers == (3, 1)
    assert config.pipeline_num_layers == 4
    assert ParallelConfig.from_dict({"zero_optimization": {"enabled": False, "stage": 3}}).zero_stage == 0


def test_user_dict_is_not_mutated() -> None:
    dist = {"zero_optimization": {"enabled": True, "stage": 1}, "data_parallel_size": 2}
    ParallelConfig.from_dict(dist, world_size=2)
    assert dist == {"zero_optimization": {"enabled": True, "stage": 1}, "data_parallel_size": 2}


@pytest.mark.parametrize(
    ("dist", "words"),
    [
        ({"tensor_paralel_size": 2}, ["unknown dist key", "did you mean 'tensor_parallel_size'"]),
        ({"zero_optimisation": True}, ["unknown dist key", "did you mean 'zero_optimization'"]),
        ({"zero_stage": 4}, ["zero_stage", "allowed: 0, 1, 2, 3"]),
        ({"zero_stage": True}, ["zero_stage"]),
        ({"mixed_precision": "fp8"}, ["mixed_precision", "bf16"]),
        ({"activation_checkpointing": "some"}, ["activation_checkpointing", "selective"]),
        ({"pipeline_schedule": "zb"}, ["pipeline_schedule", "interleaved_1f1b"]),
        ({"data_parallel_size": 0}, ["data_parallel_size", "positive integer"]),
        ({"tensor_parallel_size": 1.5}, ["tensor_parallel_size"]),
        ({"cpu_offload": True}, ["cpu_offload", "zero_stage 2 or 3"]),
        ({"sequence_parallel": True}, ["sequence_parallel", "tensor_parallel_size > 1"]),
        # Clipping is the train step's (TrainStep grad_clip), not the layout's.
        ({"max_grad_norm": 1.0}, ["unknown dist key", "max_grad_norm"]),
        ({"zero_optimization": {"enable": True}}, ["zero_optimization.enable", "enabled"]),
        ({"custom_pipeline_stage_id": [1, 0]}, ["custom_pipeline_stage_id"]),
    ],
)
def test_bad_dist_dicts_raise_config_error(dist: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        ParallelConfig.from_dict(dist)
    for word in words:
        assert word in str(error.value)


def test_heads_that_do_not_split_are_named() -> None:
    model = build("odd-heads")  # 6 query heads, 3 kv heads
    with pytest.raises(ConfigError, match=r"num_kv_heads=3 is not divisible by tensor_parallel_size=2"):
        check_tensor_parallel(model, component_plan(model), 2)
    with pytest.raises(ConfigError, match=r"num_heads=6 is not divisible by tensor_parallel_size=4"):
        check_tensor_parallel(model, component_plan(model), 4)


def test_vocab_that_does_not_split_is_padded_not_refused() -> None:
    spec = tiny_spec("gpt")
    spec["vocab_size"] = 66
    model = build_model(spec)
    entries = component_plan(model)  # the model declares its own vocab-parallel embedding and head
    check_tensor_parallel(model, entries, 4)  # padded inside the model (parallel/tensor/vocab_padding.py)
    with pytest.raises(ConfigError, match=r"vocab style needs an nn.Embedding, got Linear"):
        check_tensor_parallel(model, name_plan(model, {"lm_head": "vocab"}), 2)


def test_name_plans_reject_unknown_patterns_and_styles() -> None:
    model = build("gpt")
    with pytest.raises(ConfigError, match="matches no module"):
        name_plan(model, {"layers.*.nonexistent": "colwise"})
    with pytest.raises(ConfigError, match="did you mean 'colwise'"):
        name_plan(model, {"lm_head": "colwize"})
    with pytest.raises(ConfigError, match="colwise:N"):
        parse_style("rowwise:3", "plan.x")


def test_component_plans_cover_attention_and_feedforward() -> None:
    model = build("llama")
    styles = {entry.path: entry.style for entry in component_plan(model)}
    assert styles["layers.0.attention.q_proj"] == "colwise"
    assert styles["layers.0.attention.out_proj"] == "rowwise"
    assert styles["layers.1.feedforward.gate_proj"] == "colwise"
    assert styles["layers.1.feedforward.down_proj"] == "rowwise"


def test_packed_order_gives_each_rank_its_part_of_every_segment() -> None:
    import torch

    order = packed_order(12, segments=3, tp=2)  # q | k | v, 4 rows each
    assert order.tolist() == [0, 1, 4, 5, 8, 9, 2, 3, 6, 7, 10, 11]
    full = torch.arange(12.0).view(12, 1)
    assert torch.equal(unpack_full(full.index_select(0, order), 0, order), full)
