"""A layout the cost model prices: a dist dict plus what the train step adds (micro-batch size,
gradient accumulation, precision, optimizer, the implementation that runs it), which layers each
pipeline rank holds, and the rules a layout keeps for a model and a sequence length."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from brickwork.errors import ConfigError
from brickwork.parallel.balance import split_stages
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.planner.implementations import IMPLEMENTATIONS, Implementation
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import ModelFacts

PRECISIONS = ("fp32", "bf16-mixed", "bf16", "fp16", "fp8")
OPTIMIZERS = ("adamw", "sgd")


def planned_config(dist: Mapping[str, Any] | ParallelConfig, world_size: int | None = None) -> ParallelConfig:
    """A dist dict (the user's, or a candidate the search writes) as the ParallelConfig the cost model
    prices, checked against ``world_size`` when given: the planner's one reading of a dist dict."""
    return ParallelConfig.from_dict(dist, world_size=world_size)


def check_step_options(precision: str, optimizer: str) -> None:
    """ConfigError for a precision or optimizer the cost model does not know."""
    if precision not in PRECISIONS:
        raise ConfigError("unknown precision", "precision", choices=PRECISIONS, got=precision)
    if optimizer not in OPTIMIZERS:
        raise ConfigError("unknown optimizer", "optimizer", choices=OPTIMIZERS, got=optimizer)


@dataclass(frozen=True)
class Layout:
    """``config`` is the dist dict; ``micro_batch_size`` rows go through the model at once on each
    data-parallel rank, ``grad_accum_steps`` times per step without a pipeline (a pipeline takes
    ``config.microbatches`` instead). ``precision`` is the train step's (docs/training.md); it and
    ``optimizer`` are checked where the planner takes them (``choices.step_fields``).
    ``gpu_kernels``: the devices are GPUs, where the norms run as brickwork's Triton kernels (which
    save less than their torch twins) and SDPA runs a fused kernel (flash, cuDNN or memory-efficient)
    that keeps no attention scores whatever the dropout; on a CPU, SDPA with attention dropout runs
    its math backend, which keeps them. ``implementation``: what runs the step (implementations.py)."""

    config: ParallelConfig
    micro_batch_size: int
    grad_accum_steps: int = 1
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    gpu_kernels: bool = True
    implementation: Implementation = IMPLEMENTATIONS["brickwork"]

    @property
    def microbatches(self) -> int:
        """Micro-batches each data-parallel rank runs per step."""
        return self.config.microbatches * self.grad_accum_steps

    @property
    def rows_per_step(self) -> int:
        """The global batch: rows over all data-parallel ranks per step."""
        return self.micro_batch_size * self.microbatches * self.config.data_parallel_size

    @property
    def data_replicas(self) -> int:
        """Ranks that hold the same weights and compute on other tokens: data parallel times context
        parallel. The gradients are reduced over them and ZeRO shards over them (parallel/mesh.py,
        ``data_mesh``)."""
        return self.config.data_parallel_size * self.config.context_parallel_size

    @property
    def activation_bytes(self) -> int:
        """Bytes of an activation element: the compute precision's."""
        return 4 if self.precision == "fp32" else 2

    @property
    def parameter_bytes(self) -> int:
        """Bytes of a parameter element: fp32, or 16 bits when the optimizer holds the master weights."""
        return 2 if self.implementation.master_weights == "optimizer" else 4

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer bytes per parameter element: its fp32 states (AdamW 2, SGD's momentum 1), and the
        fp32 master weight when it holds one. Gradients are fp32 (4 bytes) either way."""
        states = {"adamw": 2, "sgd": 1}[self.optimizer]
        return 4 * (states + (self.implementation.master_weights == "optimizer"))


@dataclass(frozen=True)
class StagePlacement:
    """The layers of every pipeline rank: ``chunks[r]`` lists rank r's (start, end) layer ranges."""

    chunks: tuple[tuple[tuple[int, int], ...], ...]
    num_layers: int

    def holds_first(self, rank: int) -> bool:
        return rank == 0

    def holds_last(self, rank: int) -> bool:
        return any(end == self.num_layers for _, end in self.chunks[rank])

    def layers(self, rank: int) -> list[int]:
        return [i for start, end in self.chunks[rank] for i in range(start, end)]


def stage_placement(
    facts: ModelFacts, config: ParallelConfig, weights: list[float] | None = None
) -> StagePlacement:
    """The pipeline's layers per rank: ``pipeline_layers`` if given, else balanced on the costs
    ``parallelize`` balances them on (``ModelFacts.balance_costs``) and ``weights``, the ranks'
    relative speeds, as it splits them."""
    p, v = config.pipeline_parallel_size, config.virtual_pipeline_size
    stages = p * v
    if facts.num_layers < stages:
        raise ConfigError(
            f"{facts.num_layers} layers cannot fill {stages} pipeline stages (each needs at least one)",
            "pipeline_parallel_size",
        )
    if config.pipeline_layers is not None:
        counts = config.pipeline_layers
    else:
        stage_weights = tuple(weights[s % p] for s in range(stages)) if weights else None
        counts = _balanced(facts.balance_costs, facts.balance_head, stages, stage_weights)
    bounds, start = [], 0
    for count in counts:
        bounds.append((start, start + count))
        start += count
    # Interleaved: stage s runs on rank s mod p.
    chunks = tuple(tuple(bounds[s] for s in range(r, stages, p)) for r in range(p))
    return StagePlacement(chunks, facts.num_layers)


@lru_cache(maxsize=4096)
def _balanced(
    costs: tuple[float, ...], head: float, stages: int, weights: tuple[float, ...] | None
) -> tuple[int, ...]:
    return split_stages(costs, stages, weights, last_extra=head)


def check_layout(facts: ModelFacts, layout: Layout, world_size: int, lengths: Lengths) -> None:
    """Raise ConfigError naming the rule a layout breaks for this model, cluster and batch."""
    c = layout.config
    c.check_world_size(world_size)
    if c.zero_stage >= 2 and not layout.implementation.fsdp:
        raise ConfigError(f"zero_stage={c.zero_stage} is FSDP, which this implementation does not have")
    if c.sequence_parallel and not layout.implementation.sequence_parallel:
        raise ConfigError("this implementation has no sequence parallel")
    if c.activation_checkpointing == "selective" and layout.implementation.selective is None:
        raise ConfigError("this implementation has no selective recomputation")
    t, cp, ep = c.tensor_parallel_size, c.context_parallel_size, c.expert_parallel_size
    if c.sequence_parallel and t > 1 and facts.sequence_parallel_refused:
        raise ConfigError(facts.sequence_parallel_refused, "sequence_parallel")
    if cp > 1 and facts.context_parallel_refused:
        raise ConfigError(facts.context_parallel_refused, "context_parallel_size")
    for shape in facts.layers[:1]:
        for value, what in (
            (shape.num_heads, "attention heads"),
            (shape.num_kv_heads, "key/value heads"),
            (shape.hidden_dim, "feedforward width"),
        ):
            if value % t:
                raise ConfigError(f"tensor_parallel_size={t} does not divide the {value} {what}")
        if shape.feedforward == "moe" and shape.num_experts % ep:
            raise ConfigError(f"expert_parallel_size={ep} does not divide the {shape.num_experts} experts")
        if ep > 1 and shape.feedforward != "moe":
            raise ConfigError("expert_parallel_size > 1 needs mixture-of-experts feedforwards")
    if lengths.source % cp:
        raise ConfigError(f"context_parallel_size={cp} does not divide seq_len={lengths.source}")
    check_sequence(facts, lengths)
    if facts.num_layers < c.num_stages:
        raise ConfigError(f"{facts.num_layers} layers cannot fill {c.num_stages} pipeline stages")


def check_sequence(facts: ModelFacts, lengths: Lengths) -> None:
    """ConfigError when the model cannot take sequences of ``lengths`` tokens."""
    if facts.fixed_seq_len is not None and lengths.source != facts.fixed_seq_len:
        raise ConfigError(
            f"an image encoder's sequence is its {facts.fixed_seq_len} tokens, got seq_len={lengths.source}",
            "seq_len",
        )
    if lengths.target != lengths.source and facts.decoder_start is None:
        raise ConfigError(
            f"the {facts.kind} model reads one sequence a row; only an encoder-decoder's decoder has a "
            "length of its own",
            "target_len",
        )
    for key, length in (("seq_len", lengths.source), ("target_len", lengths.target)):
        if facts.max_seq_len is not None and length > facts.max_seq_len:
            raise ConfigError(f"{key}={length} is beyond the model's max_seq_len={facts.max_seq_len}", key)
