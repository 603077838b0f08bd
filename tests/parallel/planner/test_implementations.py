"""What an implementation keeps that brickwork's step does not (parallel/planner/implementations.py)."""

from __future__ import annotations

from dataclasses import replace

from brickwork.parallel import ParallelConfig
from brickwork.parallel.planner.activations import layer_activation_bytes
from brickwork.parallel.planner.implementations import IMPLEMENTATIONS
from brickwork.parallel.planner.layout import Layout
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import model_facts


def test_a_glu_that_keeps_its_input_only_saves_one_hidden_activation() -> None:
    """Megatron's fused SwiGLU keeps gate and up and recomputes the activated gate in backward: its
    feedforward keeps 3 tensors of the tensor-parallel rank's hidden width, not 4 (gate, up, activated
    gate, product), with or without selective recomputation of the attention core."""
    shape = model_facts("llama").layers[0]
    assert shape.feedforward == "glu"
    seq, rows, tp = 256, 2, 2
    megatron = IMPLEMENTATIONS["megatron"]
    four_tensors = replace(megatron, glu_keeps_input_only=False)
    hidden_bytes = rows * seq * shape.hidden_dim // tp * 2  # bf16
    for recompute in ("none", "selective"):
        config = ParallelConfig(
            tensor_parallel_size=tp, sequence_parallel=True, activation_checkpointing=recompute
        )
        kept = [
            layer_activation_bytes(
                shape, Layout(config, rows, implementation=i), Lengths.one(seq), rows
            ).saved
            for i in (four_tensors, megatron)
        ]
        assert kept[0] - kept[1] == hidden_bytes, recompute
