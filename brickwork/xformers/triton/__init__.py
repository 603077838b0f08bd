"""xformers' ``xformers.triton`` ops on brickwork's kernels (Triton on CUDA, exact torch twins elsewhere).

They work on every device; ``brickwork.xformers._is_triton_available()`` says whether the Triton
kernels (rather than the twins) run here."""

from brickwork.xformers.triton.dropout import FusedDropoutBias, dropout
from brickwork.xformers.triton.layer_norm import FusedLayerNorm, layer_norm
from brickwork.xformers.triton.softmax import log_softmax, softmax

__all__ = ["FusedDropoutBias", "FusedLayerNorm", "dropout", "layer_norm", "log_softmax", "softmax"]
