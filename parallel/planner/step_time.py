"""Time per training step: compute over the achievable rate, communication over the link it crosses,
and the pipeline bubble.

- **Compute**: each stage's executed FLOPs per micro-batch (flops.py; split by TP, CP and EP) over its
  device's achievable rate (fused attention kernels over the device's attention rate where it has one
  and the implementation runs torch's SDPA: Device.attention_rate, their backward 2.5 forwards),
  plus the element-wise work (norms, activations, softmax, dropout, residual
  adds), which is bound by memory bandwidth: each pass reads and writes about the bytes of the
  layer's whole activation set (activations.py), ``2 × that × passes`` over the device's bandwidth
  (selective recomputation is a fourth pass of it, plus the matmuls whose outputs it does not keep;
  one that recomputes only the attention core redoes its matmuls instead), the loss's pass over the
  logits on the last stage, and a fixed
  launch cost per layer and micro-batch. An eager implementation runs each element-wise op as a
  kernel of its own, through HBM: ``EAGER_ELEMENTWISE`` times the traffic. At fp8 the converted
  linears' FLOPs run at the float8 rate and their casts add traffic (float8.py).
- **Tensor parallel** (Megatron): per layer and micro-batch, 2 all-reduces of ``b·s·h`` in forward and 2
  in backward (sequence parallel turns each into an all-gather plus a reduce-scatter of the same
  time), and what recomputation replays of the forward's (:func:`recomputed_collectives`); the
  vocab-parallel embedding and the head's input gradient one each; an all-gather per norm in
  backward where sequence parallel keeps the norm outputs split.
  Not overlapped with compute in brickwork; an implementation that overlaps them pipelines each
  with one matmul and shows only what outlasts it, and what it slows it by (:func:`overlapped_pairs`).
- **Context parallel**: per layer, an all-gather of the keys and values in forward (again when
  recomputed) and a reduce-scatter of their gradients in backward.
- **Expert parallel**: per MoE layer, 4 all-to-alls (dispatch and combine, forward and backward) of the
  routed rows that leave the rank, ``(ep - 1) / ep`` of them under balanced routing; 6 when
  recomputation replays the forward's.
- **Pipeline**: each micro-batch sends its boundary activation forward and its gradient back, per
  stage boundary (v times as often when interleaved), on the critical path.
- **Data parallel**, over the data- and context-parallel ranks together (``Layout.data_replicas``):
  the fp32 gradients are all-reduced once per step (ZeRO 0 and 1; ZeRO-1 then
  all-gathers the updated parameters) or reduce-scattered (ZeRO 2 and 3, which also all-gather the
  parameters for every micro-batch: once under ZeRO-2, for forward and backward under ZeRO-3,
  prefetched under compute; in a pipeline ZeRO-2 once a step, ZeRO-3 m + 1 times: :func:`gathers_per_step`).
  DDP's reduction runs bucket by bucket under the last micro-batch's backward, which hides as much
  of it as that backward lasts; FSDP's reduce-scatters run unit by unit under that backward too,
  sharing the link with ZeRO-3's backward gathers, and only the first unit's gather and the last
  unit's reduce-scatter have no compute beside them. With the master weights in the optimizer,
  ZeRO-1 reduce-scatters the gradients and all-gathers the updated 16-bit parameters under the next
  step's first forward (Megatron-LM's ``--overlap-grad-reduce`` and ``--overlap-param-gather``);
  brickwork's ZeRO-1 all-gathers its fp32 parameters after the step.
- **Bubble**: with stage times ``t_s`` per micro-batch and ``m`` micro-batches, GPipe and 1F1B take
  ``(m - 1)·max(t_s) + Σ t_s`` (``(m + p - 1)·t`` for equal stages, a bubble of ``(p - 1)/m`` of the
  ideal); interleaved 1F1B with ``v`` chunks shrinks the fill and drain v-fold.

A collective hidden under compute is not free: while it runs, NCCL's kernels hold
``COLLECTIVE_BLOCKS`` of the device's SMs, and the matmuls beside it run that much slower
(``_beside``).

A ring collective over ``n`` ranks moves ``2(n - 1)/n`` of the buffer per rank for an all-reduce and
``(n - 1)/n`` for an all-gather or reduce-scatter.
"""

from __future__ import annotations

from dataclasses import dataclass

from brickwork.parallel.planner.activations import layer_activation_bytes, recomputed_matmuls
from brickwork.parallel.planner.devices import Device
from brickwork.parallel.planner.float8 import cast_bytes, converted, float8_flops
from brickwork.parallel.planner.flops import feedforward_start, head_flops, layer_flops, layer_matmuls, passes
from brickwork.parallel.planner.layout import Layout, StagePlacement
from brickwork.parallel.planner.lengths import Lengths
from brickwork.parallel.planner.model_facts import LayerShape, ModelFacts

# Bytes element-wise work moves per byte of a layer's activations, per forward-equivalent pass: it
# reads its inputs and writes its outputs.
ELEMENTWISE_TRAFFIC = 2.0
# Per layer and micro-batch, whatever its size: an eager layer's forward and backward launch about a
# hundred kernels, a few microseconds each; this is what makes many small micro-batches slower.
LAUNCH_SECONDS = 100 * 5e-6
# Host <-> device copies under cpu_offload (PCIe 4 x16, what a copy engine reaches).
OFFLOAD_BANDWIDTH = 25e9
FP32 = 4
# Thread blocks NCCL's kernels keep resident while a large collective runs beside compute: 24 for
# FSDP's all-gather beside a GEMM on an H100, as Nsight Systems shows it (docs/parallel.md, "Time per
# step"). Each holds an SM the matmuls then do without.
COLLECTIVE_BLOCKS = 24
# An eager step's element-wise traffic over a compiled (or hand-fused) one's: a Llama block's
# element-wise ops move 144 bytes per token and width unit in eager forward (RMSNorm in fp32 alone
# 36 per norm), 46 fused (docs/parallel.md, "Time per step").
EAGER_ELEMENTWISE = 144 / 46
# A flash attention kernel's backward over its forward, in FLOPs: it computes the scores again, then
# four products, five where the forward does two. FlashAttention's benchmarks count it so (Dao 2023),
# and so the rates Device.attention_fraction is taken from.
FLASH_BACKWARD = 2.5


@dataclass(frozen=True)
class Links:
    """Bus bandwidth (bytes/s) of each group a rank belongs to."""

    tp: float
    cp: float
    dp: float
    pp: float
    ep: float
    contention: float = 0.0  # compute seconds lost per second a collective runs beside it


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per step by cause; ``step`` is the total, the others say where it goes."""

    compute: float
    recompute: float
    bubble: float
    tensor_parallel: float
    context_parallel: float
    expert_parallel: float
    pipeline: float
    data_parallel: float
    offload: float
    step: float

    @property
    def communication(self) -> float:
        return (
            self.tensor_parallel
            + self.context_parallel
            + self.expert_parallel
            + self.pipeline
            + self.data_parallel
            + self.offload
        )


def _all_reduce(nbytes: float, n: int, bandwidth: float) -> float:
    return 2 * (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0


def _gather(nbytes: float, n: int, bandwidth: float) -> float:
    return (n - 1) / n * nbytes / bandwidth if n > 1 else 0.0


def _beside(communication: float, compute: float, contention: float) -> float:
    """Seconds ``communication`` adds when it runs beside ``compute``: what outlasts the compute, and
    the compute its kernels slow down while both run."""
    return max(0.0, communication - compute) + contention * min(communication, compute)


@dataclass(frozen=True)
class StageCost:
    """One pipeline rank's seconds per micro-batch: compute (of which recompute) and critical-path
    communication."""

    compute: float
    recompute: float
    tensor_parallel: float
    context_parallel: float
    expert_parallel: float
    pipeline: float

    @property
    def total(self) -> float:
        return (
            self.compute + self.tensor_parallel + self.context_parallel + self.expert_parallel + self.pipeline
        )


def microbatch_volumes(
    facts: ModelFacts, layout: Layout, placement: StagePlacement, rank: int, lengths: Lengths, rows: int
) -> dict[str, float]:
    """Bytes of each collective's full buffer (all-reduce: the tensor; all-gather: its output;
    all-to-all: the rows leaving the rank; send: the tensor) per micro-batch of ``rows`` rows on
    pipeline rank ``rank``, as ``benchmarks/parallel_comm.py`` counts them."""
    c = layout.config
    t, cp, ep = c.tensor_parallel_size, c.context_parallel_size, c.expert_parallel_size
    act = layout.activation_bytes
    tp_again, cp_again, ep_again = recomputed_collectives(layout)

    def boundary(length: int) -> float:  # the hidden states of rows of ``length`` tokens, this rank's
        return rows * length / cp * facts.dim_model * act

    out = {"tp all-reduce": 0.0, "cp all-gather": 0.0, "ep all-to-all": 0.0, "pp send": 0.0}
    # Split norm outputs are all-gathered again in backward: half an all-reduce each.
    regathers = c.sequence_parallel and not layout.implementation.gathered_norm_outputs
    for i in placement.layers(rank):
        shape = facts.layers[i]
        own = lengths.of(shape)
        if t > 1:
            out["tp all-reduce"] += (4 + tp_again) * boundary(own)
            out["tp all-reduce"] += (shape.attentions + 1) * boundary(own) / 2 if regathers else 0.0
        if cp > 1:  # the keys and values of the whole sequence
            kv = 2 * shape.num_kv_heads * shape.dim_head / t * rows * own * act
            out["cp all-gather"] += (3 if cp_again else 2) * kv
        if shape.feedforward == "moe" and ep > 1:
            routed = rows * own / cp * shape.top_k * facts.dim_model * act * (ep - 1) / ep
            out["ep all-to-all"] += (6 if ep_again else 4) * routed
    if t > 1:
        # The vocab-parallel embeddings' outputs (the decoder's where it starts), the head input's gradient.
        embeds = boundary(lengths.source) * placement.holds_first(rank)
        starts = facts.decoder_start is not None and facts.decoder_start in placement.layers(rank)
        embeds += boundary(lengths.target) * starts
        out["tp all-reduce"] += embeds + boundary(lengths.target) * placement.holds_last(rank)
    if c.pipeline_parallel_size > 1:
        # Each chunk sends its last layer's output (a decoder chunk also the encoder output its
        # successors read); under sequence parallel sharded over the TP group.
        sent = 0.0
        for _, end in placement.chunks[rank]:
            decoding = facts.decoder_start is not None and end > facts.decoder_start
            sent += boundary(lengths.source) + (boundary(lengths.target) if decoding else 0.0)
        out["pp send"] = 2 * sent / (t if c.sequence_parallel else 1)
    return out


def overlapped_pairs(
    shape: LayerShape, layout: Layout, tokens: float, float8_cost: float = 1.0
) -> list[tuple[float, float]]:
    """(gathered bytes, bf16 FLOPs of the matmul it runs under: a float8 matmul's FLOPs times
    ``float8_cost``, the bf16 rate over the float8 one) for each tensor-parallel collective of one
    layer and ``tokens`` tokens on an implementation that overlaps them: a collective pipelined with
    a matmul (Megatron's userbuffers, torch's micro-pipelined all-gather and reduce-scatter matmuls)
    can hide only under that matmul. Under sequence parallel the forward gathers the input of q, k
    and v and of the feedforward's up projection(s), and reduce-scatters the outputs of the attention
    and feedforward output projections; backward runs the same four under matmuls of equal FLOPs
    (the output projections' gradients gathered under their input-gradient matmuls, the inputs'
    gradients reduced under the weight-gradient ones, or exposed where the overlap is
    ``"single_matmul"`` and several projections' gradients are summed), a re-gather of a split norm
    output under its projection's weight gradient, and recomputation replays the forward's first
    ones (:func:`recomputed_collectives`). Without sequence parallel each all-reduce (two of these
    bytes) runs under the matmul that produces its tensor. Counted as :func:`microbatch_volumes`
    counts the layer's collectives."""
    c = layout.config
    t = c.tensor_parallel_size
    boundary = tokens * shape.dim_model * layout.activation_bytes
    mms = [2 * tokens * weights for _, weights in layer_matmuls(shape, t)]
    if layout.precision == "fp8":
        which = converted(shape, layout.implementation.float8_linears)
        mms = [mm * float8_cost if yes else mm for mm, yes in zip(mms, which, strict=True)]
    qkv, out = sum(mms[:3]), mms[3]
    ffn = mms[feedforward_start(shape) :]
    up, down = sum(ffn[:-1]), ffn[-1]
    again, _, _ = recomputed_collectives(layout)
    single = layout.implementation.tensor_parallel_overlap == "single_matmul"
    # The input gradients of separate q, k and v (of gate and up) are summed before they are reduced.
    qkv_grad = 0.0 if single and not shape.fused_qkv else qkv
    up_grad = 0.0 if single and len(ffn) > 2 else up
    if not c.sequence_parallel:
        forward = [(2 * boundary, out), (2 * boundary, down)]
        backward = [(2 * boundary, qkv_grad), (2 * boundary, up_grad)]
        return forward + backward + forward[: round(again)]
    forward = [(boundary, qkv), (boundary, out), (boundary, up), (boundary, down)]
    backward = [(boundary, qkv_grad), (boundary, out), (boundary, up_grad), (boundary, down)]
    regathers = [] if layout.implementation.gathered_norm_outputs else [(boundary, qkv), (boundary, up)]
    replayed = [forward[i] for i in ((0, 2, 1, 3) if again < 2 else range(4))][: round(2 * again)]
    return forward + backward + regathers[: shape.attentions + 1] + replayed


def recomputed_collectives(layout: Layout) -> tuple[float, bool, bool]:
    """What backward runs again of a layer's forward collectives under recomputation: (tensor-parallel
    all-reduces, or all-gather and reduce-scatter pairs, of the layer's boundary activation; whether
    the context-parallel key/value gathers; whether the expert-parallel all-to-alls).

    The implementation's own checkpoint (Megatron-LM's, DeepSpeed's) replays the layer's whole
    forward: both reductions, the gathers, the all-to-alls. ``torch.utils.checkpoint`` stops once the
    tensors backward needs are rebuilt: under full recomputation it replays all but the
    feedforward's closing reduction (1.5 under sequence parallel, its all-gathers and one
    reduce-scatter; 1 without). A selective policy that keeps the reductions' outputs (brickwork's,
    torchtitan's) replays only what it does not keep: sequence parallel's two all-gathers (1), the
    key/value gathers and the all-to-alls. Megatron's selective recomputation redoes the attention
    core alone, and with it only a context-parallel key/value exchange. Counted on brickwork's own
    step by ``tests/parallel/planner/test_planner_search.py``."""
    c = layout.config
    mode, impl = c.activation_checkpointing, layout.implementation
    sp = c.sequence_parallel
    if mode == "none":
        return 0.0, False, False
    if mode == "selective" and impl.selective == "attention_core":
        return 0.0, True, False
    if mode == "selective":
        return (1.0 if sp else 0.0), True, True
    if not impl.checkpoint_stops_early:
        return 2.0, True, True
    return (1.5 if sp else 1.0), True, True


def stage_cost(
    facts: ModelFacts,
    layout: Layout,
    placement: StagePlacement,
    rank: int,
    lengths: Lengths,
    rows: int,
    device: Device,
    links: Links,
) -> StageCost:
    """Seconds per micro-batch of ``rows`` sequences on pipeline rank ``rank``, on ``device``."""
    c = layout.config
    t, cp = c.tensor_parallel_size, c.context_parallel_size
    mode = c.activation_checkpointing
    # Selective recomputation redoes the element-wise work (a fourth pass of it), or where it keeps
    # all but the attention core, that core's matmuls.
    core_only = layout.implementation.selective == "attention_core"
    elementwise_passes = 3.0 if mode == "none" or (mode == "selective" and core_only) else 4.0
    flops = recompute_flops = traffic = 0.0
    eager = 1.0 if layout.implementation.fused_elementwise else EAGER_ELEMENTWISE
    rate = device.rate(layout.precision)
    share = rows / (t * cp)  # the rows' share of this rank; a layer's tokens are its length times it
    for i in placement.layers(rank):
        shape = facts.layers[i]
        f, own = layer_flops(shape, lengths), lengths.of(shape)
        flops += f.executed * own * share * passes(mode)
        dropped = recomputed_matmuls(shape, layout)
        if mode == "full":
            recompute_flops += f.executed * own * share
        elif mode == "selective" and core_only:
            recompute_flops += f.attention_executed * own * share
        elif dropped:
            recompute_flops += 2 * sum(layer_matmuls(shape, 1)[j][1] for j in dropped) * own * share
        everything = layer_activation_bytes(shape, layout, lengths, rows).everything
        traffic += ELEMENTWISE_TRAFFIC * everything * elementwise_passes * eager
    # Fused attention at the device's own attention rate, where it has one, taken out of the matmuls.
    moved, moved_again, fused, fused_again = _fused_attention(facts, layout, placement, rank, lengths, device)
    flops, recompute_flops = flops - moved * share, recompute_flops - moved_again * share
    flops += recompute_flops if mode == "selective" else 0.0
    launches = LAUNCH_SECONDS * len(placement.layers(rank))
    if placement.holds_last(rank):
        flops += 3 * head_flops(facts, lengths) * lengths.target * share
        traffic += head_traffic(facts, layout, rows * lengths.target / cp)
    float8, recompute_float8, casts = _float8_work(facts, layout, placement, rank, lengths, rows)
    volumes = microbatch_volumes(facts, layout, placement, rank, lengths, rows)
    elementwise = (traffic + casts) / device.memory_bandwidth
    float8_cost = _float8_cost(layout, device)
    matmul_seconds = (flops - float8 + float8 * float8_cost) / rate + fused * share
    recomputed = (recompute_flops - recompute_float8 + recompute_float8 * float8_cost) / rate
    recomputed += fused_again * share
    recomputed += elementwise / 4 if elementwise_passes == 4.0 else 0.0
    return StageCost(
        matmul_seconds + elementwise + launches,
        recomputed,
        _tensor_parallel_seconds(facts, layout, placement, rank, volumes, lengths, rows / cp, device, links),
        _gather(volumes["cp all-gather"], cp, links.cp),
        volumes["ep all-to-all"] / links.ep,
        volumes["pp send"] / links.pp,
    )


def _fused_attention(
    facts: ModelFacts, layout: Layout, placement: StagePlacement, rank: int, lengths: Lengths, device: Device
) -> tuple[float, float, float, float]:
    """Per row of pipeline rank ``rank``, where its fused attention kernels run at ``device``'s own
    attention rate (it has one, and the implementation runs torch's SDPA: Device.attention_rate):
    (the FLOPs they take out of the matmuls', of them the recomputation's, the seconds they take at
    that rate, their backward 2.5 forwards, of them the recomputation's); zeros otherwise."""
    if not (device.attention_fraction and layout.implementation.sdpa_attention):
        return 0.0, 0.0, 0.0, 0.0
    layers = (facts.layers[i] for i in placement.layers(rank))
    forward = sum(
        layer_flops(shape, lengths).attention_executed * lengths.of(shape) for shape in layers if shape.sdpa
    )
    mode = layout.config.activation_checkpointing
    core_only = layout.implementation.selective == "attention_core"
    again = forward if mode == "full" or (mode == "selective" and core_only) else 0.0
    rate = device.attention_rate(layout.precision)
    return forward * passes(mode), again, (forward * (1 + FLASH_BACKWARD) + again) / rate, again / rate


def _float8_cost(layout: Layout, device: Device) -> float:
    """A float8 FLOP's time in bf16 FLOPs (the bf16 rate over the float8 one); 1 at other precisions."""
    return device.rate(layout.precision) / device.float8_rate() if layout.precision == "fp8" else 1.0


def _float8_work(
    facts: ModelFacts, layout: Layout, placement: StagePlacement, rank: int, lengths: Lengths, rows: int
) -> tuple[float, float, float]:
    """At fp8, per micro-batch of ``rows`` rows on pipeline rank ``rank``: (FLOPs of its float8
    matmuls, of them recomputed, bytes their casts move); zeros at another precision."""
    if layout.precision != "fp8":
        return 0.0, 0.0, 0.0
    c = layout.config
    t, cp, mode = c.tensor_parallel_size, c.context_parallel_size, c.activation_checkpointing
    rule = layout.implementation.float8_linears
    float8 = recomputed = casts = 0.0
    for i in placement.layers(rank):
        shape = facts.layers[i]
        tokens = rows * lengths.of(shape) / cp  # this rank's
        share = tokens / t
        forward, again = float8_flops(shape, rule, recomputed_matmuls(shape, layout))
        float8 += forward * share * passes(mode) + again * share
        recomputed += (forward if mode == "full" else again) * share
        casts += cast_bytes(shape, rule, t, tokens)
    return float8, recomputed, casts


def _tensor_parallel_seconds(
    facts: ModelFacts,
    layout: Layout,
    placement: StagePlacement,
    rank: int,
    volumes: dict[str, float],
    lengths: Lengths,
    rows: float,
    device: Device,
    links: Links,
) -> float:
    """The tensor-parallel seconds a micro-batch of ``rows`` rows (this rank's share of them) shows on
    ``device``: all of its collectives, or, where the implementation overlaps them, what outlasts the
    matmul each is pipelined with (:func:`overlapped_pairs`)."""
    t = layout.config.tensor_parallel_size
    seconds = _all_reduce(volumes["tp all-reduce"], t, links.tp)
    if layout.implementation.tensor_parallel_overlap == "none" or t == 1:
        return seconds
    float8_cost = _float8_cost(layout, device)
    # A collective pipelined with its matmul cuts both into t pieces and runs beside all but one
    # of the matmul's: the all-gather's first piece is local, the reduce-scatter's last is its own.
    beside = (t - 1) / t / device.rate(layout.precision)
    for i in placement.layers(rank):
        tokens = rows * lengths.of(facts.layers[i])
        for nbytes, mm in overlapped_pairs(facts.layers[i], layout, tokens, float8_cost):
            alone = _gather(nbytes, t, links.tp)
            seconds += _beside(alone, mm * beside, links.contention) - alone
    return seconds


def head_traffic(facts: ModelFacts, layout: Layout, tokens: float) -> float:
    """Bytes the loss moves per micro-batch of ``tokens`` tokens on the last stage: it writes the
    logits and their fp32 log-probabilities, then reads them back and writes the logits' gradient
    (chunk by chunk under the fused head loss, the same bytes); nothing for a pooled classifier."""
    if facts.pooled_head:
        return 0.0
    t = layout.config.tensor_parallel_size
    columns = facts.head_vocab / t if facts.head_split else facts.head_vocab
    return 2 * tokens * columns * (layout.activation_bytes + FP32)


def step_volumes(layout: Layout, local_parameters: int, float8_parameters: float = 0.0) -> dict[str, float]:
    """Bytes of the data-parallel collectives per step (the benchmark's convention): DDP all-reduces
    the fp32 gradients (ZeRO-1 then all-gathers the updated parameters; with the master weights in the
    optimizer it reduce-scatters the gradients and all-gathers the 16-bit parameters); FSDP all-gathers
    the parameters for every micro-batch (twice under ZeRO-3), ``float8_parameters`` of them in one
    byte (float8.float8_weights), and reduce-scatters the gradients once."""
    c = layout.config
    out = {"dp all-reduce": 0.0, "dp all-gather": 0.0, "dp reduce-scatter": 0.0}
    if layout.data_replicas == 1:
        return out
    grads = local_parameters * 4
    if c.zero_stage == 1 and layout.implementation.master_weights == "optimizer":
        out["dp reduce-scatter"] = grads
        out["dp all-gather"] = local_parameters * layout.parameter_bytes
    elif c.zero_stage <= 1:
        out["dp all-reduce"] = grads
        if c.zero_stage == 1:
            out["dp all-gather"] = local_parameters * layout.parameter_bytes
    else:
        gathered = (local_parameters - float8_parameters) * layout.activation_bytes + float8_parameters
        out["dp all-gather"] = gathers_per_step(layout) * gathered
        out["dp reduce-scatter"] = grads
    return out


def gathers_per_step(layout: Layout) -> int:
    """How many times a ZeRO-2/3 step all-gathers the rank's parameters: without a pipeline, for every
    micro-batch (ZeRO-3 again for its backward). In a pipeline torch's schedule keeps them whole from
    a backward to the next forward (``set_reshard_after_backward(False)``) until the schedule's last
    backward: ZeRO-2 gathers once a run of the schedule; ZeRO-3, which reshards after each forward,
    gathers for every forward that follows a forward and every backward that follows a forward, m + 1
    times per chunk in every schedule (GPipe, 1F1B, interleaved: ``test_memory_model.py`` counts
    them on torch's op lists). Accumulation runs the schedule ``grad_accum_steps`` times."""
    c = layout.config
    if c.pipeline_parallel_size == 1:
        return layout.microbatches * (1 if c.zero_stage == 2 else 2)
    return layout.grad_accum_steps * (1 if c.zero_stage == 2 else c.microbatches + 1)


def data_parallel_seconds(
    layout: Layout,
    local_parameters: int,
    compute_per_microbatch: float,
    links: Links,
    units: int,
    float8_parameters: float = 0.0,
) -> tuple[float, float]:
    """(exposed data-parallel seconds per step, exposed ZeRO-2/3 gather seconds per step); ``units``
    is how many pieces FSDP gathers and reduces one by one (the rank's layers and the rest);
    ``float8_parameters`` of ``local_parameters`` are gathered in float8."""
    c = layout.config
    d = layout.data_replicas
    volumes = step_volumes(layout, local_parameters, float8_parameters)
    backward, forward = compute_per_microbatch * 2 / 3, compute_per_microbatch / 3
    reduce = _all_reduce(volumes["dp all-reduce"], d, links.dp) + _gather(
        volumes["dp reduce-scatter"], d, links.dp
    )
    k = links.contention
    if c.zero_stage <= 1:
        # Buckets reduce under the last micro-batch's backward; Megatron's distributed optimizer
        # gathers the parameters under the next forward, brickwork's ZeRO-1 after the step.
        gather = _gather(volumes["dp all-gather"], d, links.dp)
        hidden = forward if layout.implementation.master_weights == "optimizer" else 0.0
        return _beside(reduce, backward, k) + _beside(gather, hidden, k), 0.0
    m = min(layout.microbatches, gathers_per_step(layout))  # the micro-batches that gather
    per_microbatch = _gather(volumes["dp all-gather"], d, links.dp) / m
    # FSDP prefetches unit by unit: the forward's gathers run beside the forward, the backward's
    # (ZeRO-3 gathers again) beside the backward, and the last micro-batch's reduce-scatters share
    # the backward's link with them. The first unit's gather and the last reduce-scatter (the first
    # unit's gradients) have no compute left to run beside.
    in_backward = per_microbatch / 2 if c.zero_stage == 3 else 0.0
    in_forward = per_microbatch - in_backward
    hidden = 1 - 1 / units
    gathers = m * (
        in_forward / units + _beside(in_forward * hidden, forward, k) + _beside(in_backward, backward, k)
    )
    last = reduce / units + _beside(in_backward + reduce * hidden, backward, k)
    return last - _beside(in_backward, backward, k), gathers


def pipeline_step(stage_seconds: list[float], microbatches: int, virtual: int) -> tuple[float, float]:
    """(step seconds, of which bubble) of a pipeline whose ranks take ``stage_seconds`` per micro-batch."""
    slowest = max(stage_seconds)
    ideal = microbatches * slowest
    fill = (sum(stage_seconds) - slowest) / virtual
    return ideal + fill, fill


def offload_seconds(layout: Layout, local_parameters: int) -> float:
    """cpu_offload: parameters to the device and gradients back, once per step, over PCIe."""
    if not layout.config.cpu_offload:
        return 0.0
    d = layout.data_replicas
    return 2 * local_parameters / d * 4 / OFFLOAD_BANDWIDTH
