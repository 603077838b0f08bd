"""Every model kind is read and planned: decoders, encoders, encoder-decoders and image encoders; and
the device decides what attention keeps."""

from __future__ import annotations

import copy

import pytest
import torch

from brickwork.errors import ConfigError
from brickwork.factory import build_model, get_preset
from brickwork.parallel import ParallelConfig, plan
from brickwork.parallel.pipeline.stages import stage_layer_counts
from brickwork.parallel.planner import estimate
from brickwork.parallel.planner.activations import layer_activation_bytes
from brickwork.parallel.planner.flops import layer_flops, step_flops
from brickwork.parallel.planner.layout import Layout, stage_placement
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import DECODER_START, FIRST, LAST, model_facts

KINDS = {
    "gpt2": "decoder_lm",
    "llama": "decoder_lm",
    "bert-base": "encoder",
    "t5-small": "encoder_decoder",
    "vit": "image_encoder",
}
SEQ = {"gpt2": 1024, "llama": 2048, "bert-base": 512, "t5-small": 512, "vit": 197}


@pytest.mark.parametrize("preset", list(KINDS))
def test_every_kind_is_read_weight_by_weight(preset: str) -> None:
    facts = model_facts(preset)
    with torch.device("meta"):
        model = build_model(get_preset(preset))
    assert facts.kind == KINDS[preset]
    assert facts.num_parameters == sum(p.numel() for p in model.parameters())
    assert len(facts.layers) == sum(1 for w in facts.weights if w.name.endswith(".attention_norm.weight"))


def test_an_encoder_decoder_is_one_run_of_layers_with_the_decoder_start_marked() -> None:
    facts = model_facts("t5-small")
    assert facts.decoder_start == 6 and facts.num_layers == 12
    assert [s.cross_attention for s in facts.layers] == [False] * 6 + [True] * 6
    assert [s.causal for s in facts.layers] == [False] * 6 + [True] * 6
    places = {w.name: w.places for w in facts.weights if w.layer < 0}
    # The shared embedding sits first, where the decoder starts, and (tied) in the head.
    assert places["token_embedding.weight"] == {FIRST, DECODER_START, LAST}
    assert places["encoder_final_norm.weight"] == {DECODER_START}
    assert places["decoder_final_norm.weight"] == {LAST}


def test_heads_count_their_matmuls() -> None:
    bert, vit = model_facts("bert-base"), model_facts("vit")
    assert bert.head_params == 768 * 768 + 30522 * 768  # the dense layer and the (tied) decoder
    assert vit.head_params == 768 * 1000 and vit.pooled_head and vit.fixed_seq_len == 197


@pytest.mark.parametrize("preset", list(KINDS))
def test_every_kind_is_planned(preset: str) -> None:
    plans = plan(preset, "8xH100-80GB", global_batch=64, seq_len=SEQ[preset])
    assert plans[0].fits and plans[0].tokens_per_s > 0
    assert ParallelConfig.from_dict(plans[0].dist, world_size=8).world_size == 8


def test_an_image_encoder_takes_its_own_sequence() -> None:
    with pytest.raises(ConfigError, match="image encoder's sequence is its 197 tokens"):
        plan("vit", "8xH100-80GB", global_batch=64, seq_len=196)


def test_encoder_attention_is_not_causal_and_cross_attention_adds_its_square() -> None:
    bert, t5 = model_facts("bert-base"), model_facts("t5-small")
    encoder = layer_flops(bert.layers[0], Lengths.one(512))
    assert encoder.attention_executed == encoder.attention_reported == 4 * 512 * 768
    decoder = layer_flops(t5.layers[-1], Lengths.one(512))
    assert decoder.attention_executed == 4 * 512 * 512 * (0.5 + 1)  # causal self, whole cross
    assert decoder.attention_reported == 4 * 512 * 512 * 2


def test_the_device_decides_whether_attention_keeps_its_scores() -> None:
    """SDPA with attention dropout runs its math backend on a CPU (probabilities, dropout mask and
    dropped probabilities kept, and a scaled copy of q) and a fused kernel on a GPU (none of them,
    only the log-sum-exp); a dropout mask is a boolean on a GPU and fp32 on a CPU."""
    shape = model_facts("bert-base").layers[0]  # attention dropout 0.1, a 1-byte mask on the GPU
    config = ParallelConfig()
    seq, a, h, f = 512, 12, 768, 3072
    on_cpu = Layout(config, 1, precision="fp32", gpu_kernels=False)
    on_gpu = Layout(config, 1, precision="fp32", gpu_kernels=True)
    cpu = layer_activation_bytes(shape, on_cpu, Lengths.one(seq), 1)
    gpu = layer_activation_bytes(shape, on_gpu, Lengths.one(seq), 1)
    scores = 3 * a * seq * 4 + h * 4 - a * 4  # math keeps these, the fused kernel its log-sum-exp
    masks = (h + f) * (4 - 1)  # the residual and hidden dropouts' masks: fp32 against a boolean
    assert cpu.saved - gpu.saved == seq * (scores + masks)
    sdpa = model_facts("gpt2").layers[0]  # its attention dropout is the same 0.1
    spec = copy.deepcopy(get_preset("gpt2"))
    spec["decoder"]["block"]["attention"]["mechanism"]["backend"] = "math"
    explicit = model_facts(spec).layers[0]
    # A mechanism that computes its scores itself keeps them on any device.
    kept = (
        layer_activation_bytes(explicit, on_gpu, Lengths.one(seq), 1).saved
        - layer_activation_bytes(sdpa, on_gpu, Lengths.one(seq), 1).saved
    )
    assert kept >= seq * a * seq * 4


def test_an_encoder_decoder_counts_its_source_and_target_apart() -> None:
    """T5 small (width 512, 8 heads of 64, feedforward 2048, no biases, 6 + 6 layers, the 32128-row
    tied head) with 480 source and 64 target tokens a row, as its span corruption makes them from a
    window of 512: the encoder's layers work on the source, the decoder's on the target, and the
    decoder's cross-attention projects its keys and values from the source and attends to it."""
    h, f, a, d, vocab, layers = 512, 2048, 8, 64, 32128, 6
    source, target, rows = 480, 64, 3
    encoder = 2.0 * (4 * h * h + 2 * h * f) * source + 4.0 * source * source * a * d
    decoder_matmuls = 2.0 * (6 * h * h + 2 * h * f) * target + 2.0 * (2 * h * h) * source
    self_attention, cross_attention = 4.0 * target * target * a * d, 4.0 * target * source * a * d
    head = 2.0 * h * vocab * target
    facts = model_facts("t5-small")
    lengths = Lengths(source, target)
    reported = layers * (encoder + decoder_matmuls + self_attention + cross_attention) + head
    assert step_flops(facts, rows, lengths, "none") == pytest.approx(3 * rows * reported, rel=1e-12)
    executed = reported - layers * self_attention / 2  # SDPA skips the causal mask's upper half
    assert step_flops(facts, rows, lengths, "none", reported=False) == pytest.approx(
        3 * rows * executed, rel=1e-12
    )
    # Full recomputation runs the layers' forward once more, not the head's.
    full = step_flops(facts, rows, lengths, "full") - step_flops(facts, rows, lengths, "none")
    assert full == pytest.approx(rows * (reported - head), rel=1e-12)


def test_a_target_length_left_out_is_the_sources() -> None:
    plans = [
        plan("t5-small", "8xH100-80GB", global_batch=64, seq_len=512, target_len=target)
        for target in (None, 512, 64)
    ]
    assert [p.name for p in plans[0]] == [p.name for p in plans[1]]
    assert [p.step_time_s for p in plans[0]] == [p.step_time_s for p in plans[1]]
    short = plans[2][0]
    assert short.step_time_s < plans[0][0].step_time_s and short.memory_bytes < plans[0][0].memory_bytes
    assert short.tokens_per_s == 64 * 512 / short.step_time_s  # the rate counts source tokens


@pytest.mark.parametrize(
    ("preset", "dist", "sizes", "message"),
    [
        ("gpt2", None, {"seq_len": 1024, "target_len": 128}, "the decoder_lm model reads one sequence a row"),
        ("bert-base", None, {"seq_len": 512, "target_len": 64}, "the encoder model reads one sequence a row"),
        ("t5-small", None, {"seq_len": 512, "target_len": 1024}, "target_len=1024 is beyond the model's"),
        ("t5-small", None, {"seq_len": 512, "target_len": 0}, "must be an integer >= 1, got 0"),
    ],
)
def test_a_target_length_is_an_encoder_decoders_own(
    preset: str, dist: dict | None, sizes: dict, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        if dist is None:
            plan(preset, "8xH100-80GB", global_batch=64, **sizes)
        else:
            estimate(preset, "8xH100-80GB", dist, global_batch=64, **sizes)
    assert raised.value.path == "target_len" or dist is not None


def test_the_planner_offers_no_split_parallelize_refuses_the_model() -> None:
    """An encoder-decoder has no sequence parallel and, like an image encoder, no context parallel
    (parallelize's own checks say why); plan never offers them, and estimate refuses them in the
    same words."""
    long = {}
    for preset in ("t5-small", "llama"):
        long[preset] = copy.deepcopy(get_preset(preset))
        long[preset]["max_seq_len"] = 16384  # long enough for the planner to try context parallel
    t5 = plan(long["t5-small"], "8xH100-80GB", global_batch=64, seq_len=16384, target_len=2048)
    assert any(p.dist["tensor_parallel_size"] > 1 for p in t5)
    assert not any(p.dist.get("sequence_parallel") or p.dist["context_parallel_size"] > 1 for p in t5)
    llama = plan(long["llama"], "8xH100-80GB", global_batch=8, seq_len=16384)
    assert any(p.dist["context_parallel_size"] > 1 for p in llama)  # a decoder is offered both
    assert any(p.dist.get("sequence_parallel") for p in llama)
    for dist, words in (
        (
            {"tensor_parallel_size": 2, "sequence_parallel": True},
            "sequence_parallel needs the model's `layers`",
        ),
        ({"context_parallel_size": 2}, "EncoderDecoder reads a source and a target sequence"),
    ):
        with pytest.raises(ConfigError, match=words):
            estimate("t5-small", "8xH100-80GB", dist, global_batch=64, seq_len=512)


@pytest.mark.parametrize("preset", ["t5-small", "gpt2", "vit"])
def test_the_planner_places_pipeline_stages_where_parallelize_does(preset: str) -> None:
    """The planner reads parallelize's balancing costs with the spec, so a step's length does not
    move its split (when it balanced its own FLOPs at the step's length, T5 small at 128 tokens of
    512 got 9 layers before the head where parallelize puts 8); also with stages of unequal speed."""
    with torch.device("meta"):
        model = build_model(get_preset(preset))
    facts = model_facts(preset)
    cases = [{"pipeline_parallel_size": p} for p in (2, 3, 4, 6)]
    cases.append({"pipeline_parallel_size": 2, "device_weights": [1.0, 0.5]})
    for case in cases:
        world = case["pipeline_parallel_size"]
        config = ParallelConfig.from_dict({**case, "num_microbatches": 8}, world_size=world)
        placement = stage_placement(facts, config, list(config.device_weights or []) or None)
        counts = tuple(end - start for chunks in placement.chunks for start, end in chunks)
        assert counts == stage_layer_counts(model, config), case
