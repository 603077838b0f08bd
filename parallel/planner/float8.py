"""Float8 training in the cost model (``precision: fp8``): which of a layer's linears run float8
matmuls, the FLOPs those take at the device's float8 rate, and the casts they add.

``brickwork train`` at fp8 swaps a layer's linears for torchao's ``Float8Linear`` (tensorwise scaling
unless ``train.fp8_recipe`` says otherwise; brickwork/train/fp8.py): its forward, input-gradient and
weight-gradient matmuls run in float8, everything else as ``bf16-mixed``. It keeps the bf16 input for
backward, as ``nn.Linear`` does, so the memory is ``bf16-mixed``'s.

Which linears convert is the implementation's rule (``Implementation.float8_linears``):

- ``"auto"``: torchao's rule for the tensorwise recipe, brickwork's default (``_auto_filter_for_recipe``,
  from torchao's H100 benchmarks): both features multiples of 16, and not ``in <= 4096`` with
  ``out <= 1024``, below which the casts cost more than the matmul saves;
- ``"all"``: every linear of the layers (torchtitan's 2024 converter skipped only the LM head).

A mixture of experts' experts convert by the same rule (each is a linear); its router, the
embedding and the head stay in bf16. A fused q, k and v projection (``qkv_proj``) is judged as the one
linear it is.

Each converted linear casts, per micro-batch, with one scale per tensor found by a pass over it
first: its input (read for the scale, read and written as float8 for the forward; again from the
saved bf16 copy for the weight gradient), its output gradient (likewise, and a transposed float8 copy
for the weight gradient) and its weight (likewise, and transposed for the input gradient). In bytes
per element: ``CAST_INPUT`` for the input, ``CAST_TRANSPOSED`` for the output gradient and the
weight; the model adds them to the step's element-wise traffic.

An implementation that gathers FSDP's weight shards in float8 (torchao's
``enable_fsdp_float8_all_gather``, ``Implementation.float8_all_gather``) moves one byte per element of
a converted linear's weight where a bf16 gather moves two (:func:`float8_weights`).
"""

from __future__ import annotations

from functools import lru_cache

from brickwork.parallel.planner.flops import feedforward_start, layer_matmuls
from brickwork.parallel.planner.model_facts import LayerShape

# Bytes moved per element of a bf16 tensor cast to float8 with a dynamic tensorwise scale: read for
# the amax (2), read and written as float8 (3); the input again from its saved copy for the weight
# gradient (3); the output gradient and the weight once more, transposed in float8 (read 1, write 1).
CAST_INPUT = 2 + 3 + 3
CAST_TRANSPOSED = 2 + 3 + 2
# torchao's tensorwise size rule: a linear with in <= 4096 and out <= 1024 features stays in bf16.
SMALL_IN, SMALL_OUT, ALIGNMENT = 4096, 1024, 16


@lru_cache(maxsize=4096)
def converted(shape: LayerShape, rule: str) -> tuple[bool, ...]:
    """For each matmul of :func:`flops.layer_matmuls` (whole, before tensor parallel), whether
    it runs in float8 under ``rule``."""
    matmuls = layer_matmuls(shape, 1)
    out = []
    for i, (width, weights) in enumerate(matmuls):
        if shape.fused_qkv and i % 4 < 3 and i < feedforward_start(shape):
            # q, k and v are one linear (qkv_proj): judged by its whole output.
            first = i - i % 4
            width = sum(w for w, _ in matmuls[first : first + 3])
        in_features = weights / matmuls[i][0]
        if rule == "all":
            out.append(True)
        else:
            aligned = in_features % ALIGNMENT == 0 and width % ALIGNMENT == 0
            out.append(aligned and not (in_features <= SMALL_IN and width <= SMALL_OUT))
    return tuple(out)


def float8_flops(shape: LayerShape, rule: str, recomputed: tuple[int, ...] = ()) -> tuple[float, float]:
    """(forward FLOPs per token of the layer's converted matmuls; of the matmuls at the indices
    ``recomputed`` (a selective recomputation's), the converted ones' FLOPs per token)."""
    matmuls = layer_matmuls(shape, 1)
    which = converted(shape, rule)
    forward = sum(2 * weights for (_, weights), yes in zip(matmuls, which, strict=True) if yes)
    again = sum(2 * matmuls[i][1] for i in recomputed if which[i])
    return forward, again


def float8_weights(shape: LayerShape, rule: str, t: int, ep: int = 1) -> float:
    """Weight elements of one layer's converted linears on a tensor-parallel rank of ``t``: what a
    float8 all-gather moves in one byte each (a mixture of experts' rank holds ``num_experts / ep``
    experts, where :func:`flops.layer_matmuls` counts the ``top_k`` a token runs)."""
    feedforward = feedforward_start(shape)
    total = 0.0
    matmuls = zip(layer_matmuls(shape, t), converted(shape, rule), strict=True)
    for i, ((_, weights), yes) in enumerate(matmuls):
        if yes:
            moe = shape.feedforward == "moe" and i >= feedforward
            total += weights * (shape.num_experts / (shape.top_k * ep) if moe else 1.0)
    return total


def cast_bytes(shape: LayerShape, rule: str, t: int, tokens: float) -> float:
    """Bytes the float8 casts of one layer move for ``tokens`` tokens on a tensor-parallel rank of ``t``
    (each linear's input, output gradient and weight shard)."""
    total = 0.0
    for (width, weights), yes in zip(layer_matmuls(shape, t), converted(shape, rule), strict=True):
        if yes:
            in_features = weights / width
            total += tokens * (CAST_INPUT * in_features + CAST_TRANSPOSED * width) + CAST_TRANSPOSED * weights
    return total
