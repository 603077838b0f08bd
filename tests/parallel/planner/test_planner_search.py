"""The planner's search, clusters, errors, the comm model against the comm benchmark, and the CLI."""

from __future__ import annotations

import dataclasses

import pytest
import yaml
from planner_cases import SEQ, backward_collectives, gpt_spec, llama_spec, moe_spec

from brickwork.cli import main
from brickwork.errors import ConfigError
from brickwork.parallel import ParallelConfig, estimate, parallelize, plan, spawn
from brickwork.parallel.planner import parse_cluster
from brickwork.parallel.planner.flops import layer_matmuls
from brickwork.parallel.planner.implementations import IMPLEMENTATIONS
from brickwork.parallel.planner.layout import Layout, stage_placement
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import model_facts
from brickwork.parallel.planner.step_time import (
    Links,
    data_parallel_seconds,
    microbatch_volumes,
    overlapped_pairs,
    recomputed_collectives,
    stage_cost,
    step_volumes,
)


def test_cluster_strings_and_lists() -> None:
    one = parse_cluster("8xH100-80GB")
    assert one.world_size == 8 and one.uniform and one.same_node(range(8))
    many = parse_cluster("4x8xA100-80GB")
    assert many.world_size == 32 and not many.same_node([0, 8]) and many.same_node([8, 15])
    mixed = parse_cluster(
        [{"preset": "A100-80GB", "count": 2}, {"preset": "H100-80GB", "count": 2, "node": 1}]
    )
    assert not mixed.uniform and [d.name for d in mixed.devices] == ["A100-80GB"] * 2 + ["H100-80GB"] * 2
    with pytest.raises(ConfigError, match=r"unknown device.*did you mean 'H100-80GB'"):
        parse_cluster("8xH100-80G")
    with pytest.raises(ConfigError, match=r"cluster\.0\.memory_gb.*did you mean 'memory_gib'"):
        parse_cluster([{"memory_gb": 80, "bf16_tflops": 300}])


def test_every_plan_fits_and_ranks_by_step_time_with_reasons() -> None:
    plans = plan("gpt2", "8xA100-40GB", global_batch=64, seq_len=1024)
    assert plans == sorted(plans, key=lambda p: p.step_time_s)
    assert all(p.fits and p.memory_bytes <= p.device_memory_bytes for p in plans)
    assert plans[0].lost_because is None and all(p.lost_because for p in plans[1:])
    for p in plans[:20]:  # every dist dict is one parallelize takes for 8 ranks
        assert ParallelConfig.from_dict(p.dist, world_size=8).world_size == 8
    same = estimate("gpt2", "8xA100-40GB", plans[0].dist, global_batch=64, seq_len=1024,
                    grad_accum_steps=plans[0].grad_accum_steps)  # fmt: skip
    assert same.step_time_s == pytest.approx(plans[0].step_time_s)


def test_a_model_too_big_for_one_device_is_split_and_a_tiny_one_is_not() -> None:
    big = {**gpt_spec(layers=48), "dim_model": 6144, "vocab_size": 51200, "max_seq_len": 2048}
    big["decoder"]["block"]["attention"]["num_heads"] = 48
    big["decoder"]["block"]["feedforward"]["hidden_dim"] = 4 * 6144
    best = plan(big, "8xA100-80GB", global_batch=16, seq_len=2048)[0]  # 22B parameters: 350 GB of state
    assert (
        best.dist["tensor_parallel_size"] * best.dist["pipeline_parallel_size"] > 1
        or best.dist.get("zero_stage", 0) == 3
    )
    alone = estimate(big, "8xA100-80GB", {"data_parallel_size": 8}, global_batch=16, seq_len=2048)
    assert not alone.fits
    tiny = plan(gpt_spec(), "8xH100-80GB", global_batch=64, seq_len=32)[0]
    assert tiny.dist["tensor_parallel_size"] == tiny.dist["pipeline_parallel_size"] == 1


def test_nothing_fits_says_how_much_is_needed() -> None:
    with pytest.raises(ConfigError, match=r"nothing fits on 8xA100-40GB: the smallest layout.*needs .* GiB"):
        plan("llama", [{"preset": "A100-40GB", "memory_gib": 0.01, "count": 8}], global_batch=8, seq_len=512)


def test_a_prime_world_with_too_few_layers_is_refused_naming_why() -> None:
    with pytest.raises(
        ConfigError, match=r"world size 7 is prime.*does not divide the 4 heads.*needs 7 layers"
    ):
        plan(gpt_spec(layers=2), "7xH100-80GB", global_batch=7 * 3 + 1, seq_len=32)


def test_mixed_clusters_weight_stages_by_speed() -> None:
    cluster = [{"preset": "H100-80GB"}, {"preset": "A100-80GB", "node": 1}]
    spec = {**gpt_spec(layers=8), "dim_model": 1024}
    spec["decoder"]["block"]["feedforward"]["hidden_dim"] = 4096
    plans = plan(spec, cluster, global_batch=512, seq_len=32)  # compute enough for dp2 to be near the best
    pipelines = [p for p in plans if p.dist["pipeline_parallel_size"] == 2]
    weights = pipelines[0].dist["device_weights"]
    assert weights[0] == 1.0 and weights[1] == pytest.approx(312 * 0.6 / (989 * 0.57), rel=1e-3)
    rows = [p for p in plans if p.dist["data_parallel_size"] == 2]
    assert rows[0].dist["device_weights"] == weights  # rows per data-parallel rank, by the same speeds


@pytest.mark.parametrize("layout", ["tp2", "zero3-dp2", "dp2"])
def test_the_comm_model_counts_what_the_comm_benchmark_measures(layout: str) -> None:
    """benchmarks/parallel_comm.py's published measurement (docs/parallel.md) and its definitions."""
    from benchmarks.parallel_comm import BATCH, SEQ, spec

    facts = model_facts(spec())
    dist = {
        "tp2": {"tensor_parallel_size": 2},
        "zero3-dp2": {"data_parallel_size": 2, "zero_stage": 3},
        "dp2": {"data_parallel_size": 2},
    }[layout]
    config = ParallelConfig.from_dict(dist, world_size=2)
    rows = BATCH // config.data_parallel_size
    model = Layout(config, rows, precision="fp32")
    placement = stage_placement(facts, config)
    per_microbatch = microbatch_volumes(facts, model, placement, 0, Lengths.one(SEQ), rows)
    local = facts.num_parameters if layout != "tp2" else None
    if layout == "tp2":
        # The benchmark's analytical minimum, which its measurement meets but for loss-parallel
        # cross entropy's 3 all-reduces of B·T floats and the loss and count (784 bytes).
        assert per_microbatch["tp all-reduce"] == 163_840
    else:
        per_step = step_volumes(model, local)
        if layout == "zero3-dp2":
            assert per_step["dp all-gather"] == 874_496 and per_step["dp reduce-scatter"] == 437_248
        else:
            assert per_step["dp all-reduce"] == 437_248  # every gradient, once


def test_fsdp_shows_its_ends_and_the_sms_it_takes_beside_long_compute_and_everything_beside_none() -> None:
    """ZeRO-3, one micro-batch of a rank with 10 units: a bf16 gather in forward, another in backward,
    and the fp32 reduce-scatter, each a ring over 4 ranks."""
    config = ParallelConfig.from_dict({"data_parallel_size": 4, "zero_stage": 3}, world_size=4)
    layout = Layout(config, 1)
    parameters, units, bandwidth, contention = 1_000_000, 10, 1e9, 0.2
    gather = 2 * parameters * 3 / 4 / bandwidth
    reduce = 4 * parameters * 3 / 4 / bandwidth
    links = Links(*[bandwidth] * 5, contention=contention)
    # Beside long compute: the first unit's gather and the last unit's reduce-scatter have nothing
    # to run beside; the rest slows the compute by the SMs NCCL holds.
    shown = sum(data_parallel_seconds(layout, parameters, 100.0, links, units))
    beside = gather * (1 - 1 / units) + gather + reduce * (1 - 1 / units)
    assert shown == pytest.approx((gather + reduce) / units + contention * beside, rel=1e-12)
    # With no compute at all, every byte is on the critical path.
    shown = sum(data_parallel_seconds(layout, parameters, 0.0, links, units))
    assert shown == pytest.approx(2 * gather + reduce, rel=1e-12)


@pytest.mark.parametrize("name", ["megatron", "torchtitan_async_tp"])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
@pytest.mark.parametrize("sp", [True, False])
def test_overlapped_tensor_parallel_hides_each_collective_under_its_own_matmul(name, mode, sp) -> None:
    """Every tensor-parallel byte a layer's volume counts is paired with one of the layer's matmuls;
    torch's micro-pipelined overlap leaves the two summed input-gradient reductions (q, k, v; gate,
    up) exposed, Megatron's none; and a stage shows what outlasts (t - 1)/t of each matmul."""
    facts = model_facts(llama_spec(layers=1))
    dist = {"tensor_parallel_size": 2, "sequence_parallel": sp, "activation_checkpointing": mode}
    config = ParallelConfig.from_dict(dist, world_size=2)
    layout = Layout(config, 2, implementation=IMPLEMENTATIONS[name])
    placement = stage_placement(facts, config)
    shape, tokens = facts.layers[0], 2 * SEQ
    boundary = tokens * shape.dim_model * layout.activation_bytes
    pairs = overlapped_pairs(shape, layout, tokens)
    # An all-reduce is two gathers' worth; the embedding's and the head's (one each) are not paired.
    volume = microbatch_volumes(facts, layout, placement, 0, Lengths.one(SEQ), 2)["tp all-reduce"]
    assert sum(nbytes for nbytes, _ in pairs) == pytest.approx(2 * (volume - 2 * boundary))
    q, k, v, o, gate, up, down = (2 * tokens * weights for _, weights in layer_matmuls(shape, 2))
    assert {mm for _, mm in pairs} <= {q + k + v, o, gate + up, down, 0.0}
    exposed = [nbytes for nbytes, mm in pairs if mm == 0.0]
    assert exposed == ([boundary if sp else 2 * boundary] * 2 if name == "torchtitan_async_tp" else [])
    # Over a link so slow that every collective outlasts its matmul, the stage shows all the traffic
    # less the (t - 1)/t of each matmul it ran beside.
    device = parse_cluster("2xH100-80GB").devices[0]
    bandwidth = 1e6
    cost = stage_cost(facts, layout, placement, 0, Lengths.one(SEQ), 2, device, Links(*[bandwidth] * 5))
    hidden = sum(mm for _, mm in pairs) / 2 / device.rate(layout.precision)
    assert cost.tensor_parallel == pytest.approx(volume / bandwidth - hidden, rel=1e-9)


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
@pytest.mark.parametrize("name", ["brickwork", "megatron"])
def test_fused_attention_runs_at_the_devices_attention_rate(mode: str, name: str) -> None:
    """On an H100, SDPA's attention FLOPs (causal: half of 4·s·h per token and layer) leave the
    matmuls' rate for the attention rate, backward counted at 2.5 forwards, one forward more where the
    recomputation redoes them; an implementation with kernels of its own (Megatron) and a device
    without an attention fraction price them as matmuls."""
    facts = model_facts(llama_spec(layers=2))
    config = ParallelConfig.from_dict({"activation_checkpointing": mode}, world_size=1)
    layout = Layout(config, 2, implementation=IMPLEMENTATIONS[name])
    placement = stage_placement(facts, config)
    h100 = parse_cluster("H100-80GB").devices[0]
    as_matmuls = dataclasses.replace(h100, attention_fraction=0.0)
    links = Links(*[1e12] * 5)
    own = stage_cost(facts, layout, placement, 0, Lengths.one(SEQ), 2, h100, links)
    plain = stage_cost(facts, layout, placement, 0, Lengths.one(SEQ), 2, as_matmuls, links)
    shape = facts.layers[0]
    attention = 2 * 2 * SEQ * (4.0 * SEQ * shape.num_heads * shape.dim_head / 2)  # 2 layers, 2 rows
    redone = {"none": 0.0, "full": 1.0, "selective": 1.0 if name == "megatron" else 0.0}[mode]
    peak = 989e12
    expected = attention * ((3.5 + redone) / (0.30 * peak) - (3.0 + redone) / (0.57 * peak))
    if name == "megatron":
        expected = 0.0
    assert own.compute - plain.compute == pytest.approx(expected, rel=1e-9, abs=1e-15)
    recomputed = attention * redone * (1 / (0.30 * peak) - 1 / (0.57 * peak))
    assert own.recompute - plain.recompute == pytest.approx(
        0.0 if name == "megatron" else recomputed, rel=1e-9, abs=1e-15
    )


def test_expert_parallel_traffic_is_the_benchmarks_under_balanced_routing() -> None:
    """benchmarks/parallel_comm.py measured 67,584 all-to-all bytes at ep2 (docs/parallel.md) for its
    step's routing; balanced routing sends half of each rank's 64 routed rows per MoE layer."""
    from benchmarks.parallel_comm import BATCH, SEQ, spec

    facts = model_facts(spec(moe=True))
    config = ParallelConfig.from_dict({"data_parallel_size": 2, "expert_parallel_size": 2}, world_size=2)
    layout = Layout(config, BATCH // 2, precision="fp32")
    placement = stage_placement(facts, config)
    volume = microbatch_volumes(facts, layout, placement, 0, Lengths.one(SEQ), BATCH // 2)["ep all-to-all"]
    assert volume == 65_536
    assert abs(volume / 67_584 - 1) < 0.05


def test_brickwork_plan_prints_the_table_and_writes_the_dist_dict(tmp_path, capsys) -> None:
    out = tmp_path / "dist.yaml"
    code = main(["plan", "gpt2", "--devices", "8xH100-80GB", "--nodes", "2", "--global-batch", "64",
                 "--seq-len", "1024", "--top", "3", "--out", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "layouts fit on 2x8xH100-80GB" in printed and "| 1 | tp" in printed and "| best |" in printed
    dist = yaml.safe_load(out.read_text())["dist"]
    assert ParallelConfig.from_dict(dist, world_size=16).world_size == 16


def test_brickwork_plan_reports_a_bad_device_in_one_line(capsys) -> None:
    assert main(["plan", "gpt2", "--devices", "8xB200"]) == 2
    assert "unknown device" in capsys.readouterr().err


def test_the_chosen_dist_dict_parallelizes_in_one_process() -> None:
    from brickwork.factory import build_model

    best = plan(
        gpt_spec(), [{"name": "cpu", "memory_gib": 1, "bf16_tflops": 0.1}], global_batch=4, seq_len=32
    )[0]
    parallelize(build_model(gpt_spec()), best.dist)


@pytest.mark.distributed
def test_recomputation_replays_the_collectives_the_model_says() -> None:
    """brickwork's backward under no, selective and full recomputation, its collectives counted per
    layer (two layers less one): what recomputation adds is what ``recomputed_collectives`` prices,
    at tp2 with and without sequence parallel (all-gathers and reduce-scatters count half an
    all-reduce), cp2 (a gather each of keys and values) and ep2 (dispatch and combine)."""
    layouts = {
        "tp2 sp": (llama_spec, {"tensor_parallel_size": 2, "sequence_parallel": True}, SEQ),
        "tp2": (llama_spec, {"tensor_parallel_size": 2}, SEQ),
        "cp2": (llama_spec, {"context_parallel_size": 2}, SEQ // 2),
        "ep2": (moe_spec, {"data_parallel_size": 2, "expert_parallel_size": 2}, SEQ),
    }
    modes = ("none", "selective", "full")
    cases = [
        (make(layers), {**dist, "activation_checkpointing": mode}, length)
        for make, dist, length in layouts.values()
        for mode in modes
        for layers in (1, 2)
    ]
    counts = iter(spawn(backward_collectives, 2, cases, timeout=300)[0])
    for name, (_, dist, _) in layouts.items():
        per_layer = {}
        for mode in modes:
            one, two = next(counts), next(counts)
            per_layer[mode] = {k: two.get(k, 0) - one.get(k, 0) for k in set(one) | set(two)}
        for mode in modes[1:]:
            extra = {k: per_layer[mode].get(k, 0) - per_layer["none"].get(k, 0) for k in per_layer[mode]}
            config = ParallelConfig.from_dict({**dist, "activation_checkpointing": mode}, world_size=2)
            tp, cp, ep = recomputed_collectives(Layout(config, 1))
            halves = extra.get("all_gather_into_tensor", 0) + extra.get("reduce_scatter_tensor", 0)
            measured = {
                "tp2 sp": (halves / 2, False, False),
                "tp2": (extra.get("all_reduce", 0), False, False),
                "cp2": (0.0, extra.get("all_gather_into_tensor", 0) == 2, False),
                "ep2": (0.0, False, extra.get("all_to_all_single", 0) == 2),
            }[name]
            predicted = (tp if name.startswith("tp") else 0.0, cp and name == "cp2", ep and name == "ep2")
            assert measured == predicted, (name, mode, extra)
