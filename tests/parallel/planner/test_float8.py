"""The planner at ``precision: fp8``: the linears it prices as float8 are those ``brickwork train``
converts, float8 needs a device with float8 matmuls, and the step keeps bf16-mixed's memory while its
converted matmuls run at the float8 rate. (torchtitan's published Float8 runs: test_published_runs.)"""

from __future__ import annotations

import copy

import pytest
import torch
from planner_cases import llama_spec, moe_spec

from brickwork.errors import ConfigError
from brickwork.factory import build_model, get_preset
from brickwork.parallel import ParallelConfig, estimate
from brickwork.parallel.planner import parse_cluster
from brickwork.parallel.planner.float8 import cast_bytes, converted, float8_flops, float8_weights
from brickwork.parallel.planner.flops import layer_matmuls
from brickwork.parallel.planner.implementations import IMPLEMENTATIONS
from brickwork.parallel.planner.layout import Layout
from brickwork.parallel.planner.model_facts import model_facts
from brickwork.parallel.planner.step_time import step_volumes


def _one_layer(name: str) -> dict:
    spec = copy.deepcopy(get_preset(name))
    spec["decoder"]["num_layers"] = 1
    return spec


def _wide_moe() -> dict:
    """Mixtures of 4 experts at width 2048: each expert's linears convert, the router does not."""
    spec = moe_spec(layers=1)
    spec["dim_model"] = 2048
    spec["decoder"]["block"]["attention"]["num_heads"] = 16
    spec["decoder"]["block"]["feedforward"]["hidden_dim"] = 4096
    return spec


@pytest.mark.parametrize(
    "make",
    [
        lambda: _one_layer("gpt2"),
        lambda: _one_layer("llama3-8b"),
        lambda: _one_layer("llama3-70b"),
        _wide_moe,
    ],
    ids=["gpt2 (fused qkv)", "llama3-8b (small k and v)", "llama3-70b", "moe"],
)
def test_the_float8_linears_are_the_ones_brickwork_converts(make) -> None:
    """torchao's tensorwise size rule, as ``brickwork train`` applies it (brickwork/train/fp8.py), picks
    the weights the planner prices as float8: a fused q, k, v projection judged whole, GQA's narrow k
    and v left out, a mixture of experts' experts in and its router out."""
    pytest.importorskip("torchao")
    from brickwork.train.fp8 import fp8_candidates

    spec = make()
    with torch.device("meta"):
        model = build_model(spec)
    modules = dict(model.named_modules())
    chosen = fp8_candidates(model, "tensorwise", None)
    layer0 = [n for n in chosen if n.startswith("layers.0.")]
    by_brickwork = sum(modules[n].weight.numel() for n in layer0)
    shape = model_facts(spec).layers[0]
    by_planner = sum(
        weights
        for (_, weights), yes in zip(layer_matmuls(shape, 1), converted(shape, "auto"), strict=True)
        if yes
    )
    assert by_planner == by_brickwork > 0


def test_fp8_needs_a_device_with_float8_matmuls() -> None:
    dist = {"data_parallel_size": 2}
    with pytest.raises(ConfigError, match=r"precision: fp8 needs float8 matmuls, which A100-80GB has none"):
        estimate(llama_spec(), "2xA100-80GB", dist, global_batch=4, seq_len=32, precision="fp8")
    cluster = [{"preset": "A100-80GB", "fp8_tflops": 624, "count": 2}]
    assert estimate(llama_spec(), cluster, dist, global_batch=4, seq_len=32, precision="fp8").fits


def test_fp8_keeps_the_memory_and_runs_its_float8_matmuls_at_the_float8_rate() -> None:
    """Llama 3 8B on 8 H100s under ZeRO-3: the memory is bf16-mixed's to the byte, and the compute
    is shorter by the converted matmuls' FLOPs at the float8 rate, less their casts' traffic."""
    spec = get_preset("llama3-8b")
    dist = {"data_parallel_size": 8, "zero_stage": 3, "activation_checkpointing": "none"}
    options = {"global_batch": 8, "seq_len": 2048, "micro_batch_size": 1}
    bf16 = estimate(spec, "8xH100-80GB", dist, precision="bf16-mixed", **options)
    fp8 = estimate(spec, "8xH100-80GB", dist, precision="fp8", **options)
    assert fp8.memory_bytes == bf16.memory_bytes and fp8.fits
    device = parse_cluster("H100-80GB").devices[0]
    facts = model_facts(spec)
    tokens = 2048
    saved = casts = 0.0
    for shape in facts.layers:
        forward, _ = float8_flops(shape, "auto")
        saved += 3 * forward * tokens * (1 / device.rate("fp8") - 1 / device.float8_rate())
        casts += cast_bytes(shape, "auto", 1, tokens) / device.memory_bandwidth
    assert bf16.time.compute - fp8.time.compute == pytest.approx(saved - casts, rel=1e-9)
    assert fp8.step_time_s < bf16.step_time_s


@pytest.mark.parametrize("zero", [2, 3])
def test_float8_all_gather_moves_one_byte_per_converted_weight(zero: int) -> None:
    """FSDP's gathers of Llama 3 8B at fp8 where the implementation gathers the float8 linears'
    weights in float8: per gather, the layers' q, k, v, o, gate, up and down weights (every linear
    converts under torchtitan's rule) in one byte each, the embedding, the head and the norms in two;
    ZeRO-3 gathers twice a micro-batch. The memory is the same, the exposed gather time shorter."""
    spec = get_preset("llama3-8b")
    h, f, kv = 4096, 14336, 1024
    linears = 32 * (2 * h * h + 2 * h * kv + 3 * h * f)  # written out, not read from the planner
    facts = model_facts(spec)
    assert sum(float8_weights(shape, "all", 1) for shape in facts.layers) == linears
    total = facts.num_parameters
    dist = {"data_parallel_size": 8, "zero_stage": zero, "activation_checkpointing": "full"}
    config = ParallelConfig.from_dict(dist, world_size=8)
    gathers = 2 if zero == 3 else 1
    for name, converted_weights, expected in (
        ("torchtitan", 0, 2 * total),
        ("torchtitan_float8_all_gather", linears, 2 * (total - linears) + linears),
    ):
        layout = Layout(config, 1, precision="fp8", implementation=IMPLEMENTATIONS[name])
        volumes = step_volumes(layout, total, converted_weights)
        assert volumes["dp all-gather"] == gathers * expected
    options = {"global_batch": 8, "seq_len": 2048, "micro_batch_size": 1, "precision": "fp8"}
    bf16 = estimate(spec, "8xH100-80GB", dist, implementation="torchtitan", **options)
    float8 = estimate(spec, "8xH100-80GB", dist, implementation="torchtitan_float8_all_gather", **options)
    assert float8.memory_bytes == bf16.memory_bytes
    assert float8.time.data_parallel < bf16.time.data_parallel
    assert float8.time.compute == bf16.time.compute
