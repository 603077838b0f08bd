"""Every model kind is read and planned: decoders, encoders, encoder-decoders and image encoders; and
the device decides what attention keeps."""

from __future__ import annotations

import copy

import pytest
import torch

from brickwork.errors import ConfigError
from brickwork.factory import build_model, get_preset
from brickwork.parallel import ParallelConfig, plan
from brickwork.parallel.planner.activations import layer_activation_bytes
from brickwork.parallel.planner.flops import layer_flops
from brickwork.parallel.planner.layout import Layout
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
    encoder = layer_flops(bert.layers[0], 512)
    assert encoder.attention_executed == encoder.attention_reported == 4 * 512 * 768
    decoder = layer_flops(t5.layers[-1], 512)
    assert decoder.attention_executed == 4 * 512 * 512 * (0.5 + 1)  # causal self, whole cross
    assert decoder.attention_reported == 4 * 512 * 512 * 2


def test_the_device_decides_whether_attention_keeps_its_scores() -> None:
    """SDPA with attention dropout runs its math backend on a CPU (probabilities, dropout mask and
    dropped probabilities kept, and a scaled copy of q) and a fused kernel on a GPU (none of them,
    only the log-sum-exp); a dropout mask is a boolean on a GPU and fp32 on a CPU."""
    shape = model_facts("bert-base").layers[0]  # attention dropout 0.1, a 1-byte mask on the GPU
    config = ParallelConfig()
    seq, a, h, f = 512, 12, 768, 3072
    cpu = layer_activation_bytes(shape, Layout(config, 1, precision="fp32", gpu_kernels=False), seq, 1)
    gpu = layer_activation_bytes(shape, Layout(config, 1, precision="fp32", gpu_kernels=True), seq, 1)
    scores = 3 * a * seq * 4 + h * 4 - a * 4  # math keeps these, the fused kernel its log-sum-exp
    masks = (h + f) * (4 - 1)  # the residual and hidden dropouts' masks: fp32 against a boolean
    assert cpu.saved - gpu.saved == seq * (scores + masks)
    sdpa = model_facts("gpt2").layers[0]  # its attention dropout is the same 0.1
    spec = copy.deepcopy(get_preset("gpt2"))
    spec["decoder"]["block"]["attention"]["mechanism"]["backend"] = "math"
    explicit = model_facts(spec).layers[0]
    on_gpu = Layout(config, 1, precision="fp32", gpu_kernels=True)
    # A mechanism that computes its scores itself keeps them on any device.
    kept = (
        layer_activation_bytes(explicit, on_gpu, seq, 1).saved
        - layer_activation_bytes(sdpa, on_gpu, seq, 1).saved
    )
    assert kept >= seq * a * seq * 4
