"""How a training implementation keeps its state and activations and hides its communication: the
few ways the published runs the planner is checked against differ from brickwork's own step.

The planner prices brickwork (``"brickwork"``). A published run is priced as the software that ran it
did its work, so that what is compared with it is the device and the layout, not the software:

- ``"megatron"``: Megatron-LM as its H100 scaling runs used it (README, "Performance Benchmarking":
  ``--overlap-grad-reduce``, ``--overlap-param-gather``, ``--tp-comm-overlap``), with the
  distributed optimizer and sequence parallel as Korthikanti et al. 2022 (arXiv 2205.05198,
  sections 4.2.2 and 5) write it; Meta's Llama 3 training keeps its master weights the same way;
- ``"deepspeed"``: Megatron-DeepSpeed as BLOOM ran it (bigscience-workshop/bigscience,
  train/tr11-176B-ml/README.md);
- ``"torchtitan"``: torchtitan as its published Llama 3 benchmarks ran
  (benchmarks/llama3_h100_202412_torchtitan.md), compiled; ``"torchtitan_eager"`` the same without
  torch.compile; ``"torchtitan_2025"`` as its June 2025 benchmarks ran it, ``"torchtitan_async_tp"``
  with async tensor parallel (benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md) and
  ``"torchtitan_float8_all_gather"`` with FSDP's float8 weight gathers
  (benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md), both of 2025 too;
- ``"plain"``: a plain loop such as nanoGPT's.
"""

from __future__ import annotations

from dataclasses import dataclass

from brickwork.errors import ConfigError


@dataclass(frozen=True)
class Implementation:
    """What differs between implementations of one layout.

    - ``master_weights``: ``"parameters"``: the parameters are the fp32 master weights, 16-bit compute
      copies come from autocast or FSDP's gathers, and DDP keeps its buckets beside the gradients
      (ZeRO-1 all-reduces the gradients, then all-gathers fp32 parameters after the step).
      ``"optimizer"``: 16-bit parameters, fp32 gradients accumulated in one buffer the reduction works
      on in place, the fp32 master copy in the optimizer beside its moments, split evenly under ZeRO-1
      (the gradients reduce-scattered, the 16-bit parameters all-gathered under the next forward).
    - ``gathered_norm_outputs``: under sequence parallel the column-parallel projections keep their
      all-gathered input (the norm's output) whole; False: it stays split over the sequence and is
      gathered again in backward (Korthikanti et al. 4.2.2).
    - ``selective``: what selective recomputation keeps. ``"matmuls"``: the outputs of every matmul,
      of attention and of the tensor-parallel reductions, recomputing the element-wise work
      (brickwork, parallel/activation_checkpointing.py); ``"alternate_matmuls"``: attention's and the
      reductions' outputs and the 1st, 3rd, 5th ... matmul's of each layer, recomputing the rest
      (torchtitan's per-op policy, activations.recomputed_matmuls); ``"attention_core"``:
      everything but the attention core (Korthikanti et al. 5), which with a fused attention kernel
      that keeps no scores saves next to nothing; None: there is none, only full recomputation.
    - ``tensor_parallel_overlap``: how tensor-parallel collectives run beside the matmuls they are
      pipelined with (step_time.overlapped_pairs); only what outlasts its matmul shows, and the SMs
      its kernels take from it. ``"none"``: exposed. ``"every"``: every collective, backward's
      input-gradient reductions under the weight-gradient matmuls (Megatron-LM's
      ``--tp-comm-overlap``). ``"single_matmul"``: a collective fuses with one matmul that reads its
      gathered output or writes its reduced input (torch's micro-pipelined all-gather and
      reduce-scatter matmuls, ``torch/_inductor/fx_passes/micro_pipeline_tp.py``), so the
      reduction of an input gradient summed over separate projections (q, k and v; gate and up)
      has no single producer and stays exposed.
    - ``fused_head_loss``: a decoder LM's loss, where its head is whole on the rank, is a chunked
      fused linear + cross-entropy that never holds the logits (brickwork's causal-LM step);
      False: the loss takes the whole logits.
    - ``half_gradients``: backward writes 16-bit gradients that are added into the fp32 buffer after
      each micro-batch, so both exist at the end of a backward (DeepSpeed's BF16_Optimizer).
    - ``fsdp``: ZeRO-2 and -3 exist (FSDP); without them a layout shards at most the optimizer.
    - ``sequence_parallel``: sequence parallel exists (the planner turns it on with tensor parallel).
    - ``fused_elementwise``: chains of element-wise ops run as one kernel (torch.compile, Triton or
      hand-fused CUDA kernels); False: eager PyTorch, one kernel per op, each through HBM.
    - ``checkpoint_stops_early``: recomputation is ``torch.utils.checkpoint``'s, which replays a
      layer's forward in backward only until what backward needs is rebuilt: under full
      recomputation every collective but the feedforward's closing tensor-parallel reduction
      (step_time.recomputed_collectives); False: the implementation's own checkpoint replays the
      whole forward of the layer, collectives and all (Megatron-LM, DeepSpeed).
    - ``float8_linears``: at ``precision: fp8``, which of a layer's linears run float8 matmuls
      (float8.py): ``"auto"``, torchao's size rule for the tensorwise recipe (brickwork's
      default); ``"all"``, every one (torchtitan's 2024 converter).
    - ``glu_keeps_input_only``: a GLU's activation is one autograd function that keeps only its input
      (gate and up) and recomputes the activated gate in backward, so a GLU feedforward keeps ``3f``
      (gate, up, the down projection's input) rather than ``4f`` (Megatron-LM's
      ``megatron/core/fusions/fused_bias_swiglu.py``: ``swiglu_back`` reads the input alone).
    - ``float8_matmuls_kept``: at fp8, per-op selective recomputation keeps and counts the float8
      matmuls' outputs as it does bf16 ones (torchtitan until February 2025, whose save list held
      ``aten.abs``, so that every cast's input magnitude was kept: its 2024 Float8 rows are met so);
      False: a float8 matmul is ``aten._scaled_mm``, which the policy neither counts nor keeps, so every
      converted one is recomputed (activations.recomputed_matmuls; torchtitan from 2025-02-06).
    - ``float8_all_gather``: at fp8, FSDP gathers the converted linears' weights in float8, one byte an
      element (torchao's ``enable_fsdp_float8_all_gather``; float8.float8_weights); False: in bf16.
    - ``sdpa_attention``: fused attention runs torch's SDPA kernels, at the device's own attention
      rate (Device.attention_rate); False: kernels that reach the matmuls' fraction of peak
      (Transformer Engine's cuDNN fused attention on Hopper, which Megatron-LM runs: FlashAttention-3
      and cuDNN 9 reach 0.5 to 0.75 of an H100's peak where FlashAttention-2 reaches 0.35; Shah et al.
      2024, arXiv 2407.08608).
    """

    master_weights: str = "parameters"
    gathered_norm_outputs: bool = True
    selective: str | None = "matmuls"
    tensor_parallel_overlap: str = "none"
    fused_head_loss: bool = True
    half_gradients: bool = False
    fsdp: bool = True
    sequence_parallel: bool = True
    fused_elementwise: bool = True
    checkpoint_stops_early: bool = True
    glu_keeps_input_only: bool = False
    float8_linears: str = "auto"
    float8_matmuls_kept: bool = True
    float8_all_gather: bool = False
    sdpa_attention: bool = True


IMPLEMENTATIONS: dict[str, Implementation] = {
    "brickwork": Implementation(),
    "megatron": Implementation(
        master_weights="optimizer",
        gathered_norm_outputs=False,
        selective="attention_core",
        tensor_parallel_overlap="every",
        fused_head_loss=False,
        fsdp=False,
        checkpoint_stops_early=False,
        glu_keeps_input_only=True,
        sdpa_attention=False,
    ),
    # Megatron-DeepSpeed as BLOOM ran it (2022): Megatron's layers without sequence parallel,
    # selective recomputation or overlapped tensor-parallel traffic; DeepSpeed's BF16_Optimizer.
    "deepspeed": Implementation(
        master_weights="optimizer",
        selective=None,
        fused_head_loss=False,
        half_gradients=True,
        fsdp=False,
        sequence_parallel=False,
        checkpoint_stops_early=False,
    ),
    # A plain training loop (nanoGPT's): fp32 weights under autocast, the loss over the whole logits.
    "plain": Implementation(fused_head_loss=False),
    # Built from the same torch pieces as brickwork (FSDP2, DTensor tensor and sequence parallel,
    # selective checkpointing by op); its loss takes the whole logits.
    "torchtitan": Implementation(selective="alternate_matmuls", fused_head_loss=False, float8_linears="all"),
    # The same with async tensor parallel (torch's micro-pipelined all-gather and reduce-scatter
    # matmuls) over its separate q, k, v, gate and up projections.
    "torchtitan_async_tp": Implementation(
        selective="alternate_matmuls",
        fused_head_loss=False,
        tensor_parallel_overlap="single_matmul",
        float8_linears="all",
        float8_matmuls_kept=False,
    ),
    # torchtitan as its June 2025 benchmarks ran it: aten.abs gone from the per-op save list.
    "torchtitan_2025": Implementation(
        selective="alternate_matmuls", fused_head_loss=False, float8_linears="all", float8_matmuls_kept=False
    ),
    # The same, FSDP gathering the float8 linears' weights in float8 (as the H200 benchmark of
    # benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md ran it).
    "torchtitan_float8_all_gather": Implementation(
        selective="alternate_matmuls",
        fused_head_loss=False,
        float8_linears="all",
        float8_matmuls_kept=False,
        float8_all_gather=True,
    ),
    # The same, without torch.compile: every element-wise op is a kernel of its own.
    "torchtitan_eager": Implementation(
        selective="alternate_matmuls", fused_head_loss=False, fused_elementwise=False, float8_linears="all"
    ),
}


def implementation(name: str, precision: str) -> Implementation:
    """The implementation called ``name``; ConfigError for an unknown one, or for 16-bit parameters
    at fp32."""
    if name not in IMPLEMENTATIONS:
        raise ConfigError("unknown implementation", "implementation", choices=IMPLEMENTATIONS, got=name)
    chosen = IMPLEMENTATIONS[name]
    if chosen.master_weights == "optimizer" and precision == "fp32":
        raise ConfigError(
            f"{name} keeps 16-bit parameters with fp32 master weights in the optimizer: it needs a 16-bit "
            "precision (bf16-mixed, bf16 or fp16)",
            "implementation",
        )
    return chosen
