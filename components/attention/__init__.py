"""Attention mechanisms (q, k, v -> out) and the multi-head layer around them.

Importing this package registers every built-in mechanism in :data:`ATTENTION_REGISTRY`.
"""

from brickwork.components.attention.base import ATTENTION_REGISTRY, AttentionMechanism, register_attention
from brickwork.components.attention.compositional import CompositionalAttention
from brickwork.components.attention.document_mask import DocumentMask
from brickwork.components.attention.favor import FavorAttention
from brickwork.components.attention.fourier_mix import FourierMix
from brickwork.components.attention.kv_cache import KVCache
from brickwork.components.attention.lambda_layer import LambdaLayer
from brickwork.components.attention.linformer import LinformerAttention
from brickwork.components.attention.local import LocalAttention
from brickwork.components.attention.multi_head import MultiHeadAttention, build_mechanism
from brickwork.components.attention.nystrom import NystromAttention
from brickwork.components.attention.ortho import OrthoformerAttention
from brickwork.components.attention.pooling import Pooling
from brickwork.components.attention.scaled_dot_product import (
    ScaledDotProduct,
    dense_attention,
    math_attention,
)
from brickwork.components.attention.sparse import PatternAttention
from brickwork.components.attention.sparse_patterns import (
    BlockSparseAttention,
    GlobalAttention,
    RandomAttention,
)
from brickwork.components.attention.visual import VisualAttention

__all__ = [
    "ATTENTION_REGISTRY",
    "AttentionMechanism",
    "BlockSparseAttention",
    "CompositionalAttention",
    "DocumentMask",
    "FavorAttention",
    "FourierMix",
    "GlobalAttention",
    "KVCache",
    "LambdaLayer",
    "LinformerAttention",
    "LocalAttention",
    "MultiHeadAttention",
    "NystromAttention",
    "OrthoformerAttention",
    "PatternAttention",
    "Pooling",
    "RandomAttention",
    "ScaledDotProduct",
    "VisualAttention",
    "build_mechanism",
    "dense_attention",
    "math_attention",
    "register_attention",
]
