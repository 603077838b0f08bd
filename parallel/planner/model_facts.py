"""What the cost model needs to know about a spec: every weight's shape, where a pipeline puts it and
how tensor parallel splits it, and each layer's sizes for the activation and FLOP formulas.

The spec is resolved by the factory and instantiated on torch's ``meta`` device, which records every
parameter's shape and allocates nothing, so a 1T-parameter spec is read in about a second on any
machine. How a weight splits comes from the components' own ``tp_plan()`` declarations, and where a
pipeline puts it from the model's stage recipe (parallel/pipeline/stages.py): the same data
``parallelize`` applies, and the costs it balances a pipeline's stages on. Every model kind is
read: decoder LMs, encoders (a masked-LM head or none), encoder-decoders (the encoder's layers, then
the decoder's, as one run that pipeline stages cut) and image encoders (a fixed number of patches per
image, one classified token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import nn

from brickwork.errors import ConfigError

# Where a weight outside the layers sits: the first stage (embeddings), the last (final norm, head),
# and the stage where an encoder-decoder's decoder starts (a copy of the embedding, the encoder's
# final norm). A tied weight sits in several.
FIRST, LAST, DECODER_START = "first", "last", "decoder_start"


@dataclass(frozen=True)
class Weight:
    """One parameter: its shape, where it sits, and how tensor parallel splits it.

    ``layer`` is its layer's index in the run of all layers (-1 outside the layers), ``places`` the
    outer places it sits in; ``tp_dim`` is the dim TP shards (None: replicated on every TP rank);
    ``segments`` are packed parts split separately (``colwise:3``); ``vocab`` marks vocabulary rows
    padded when TP does not divide them; ``expert`` marks a weight expert parallel splits on dim 0.
    """

    name: str
    shape: tuple[int, ...]
    layer: int = -1
    places: frozenset[str] = frozenset()
    tp_dim: int | None = None
    segments: int = 1
    vocab: bool = False
    expert: bool = False

    def local_shape(self, tp: int, vocab_multiple: int = 64, ep: int = 1) -> tuple[int, ...]:
        """The shape rank 0 holds under ``tp`` (and ``ep`` for an expert weight): torch.chunk's split."""
        shape = list(self.shape)
        if self.expert and ep > 1:
            shape[0] = math.ceil(shape[0] / ep)
        if self.tp_dim is not None and tp > 1:
            size = shape[self.tp_dim]
            if self.vocab and size % tp:
                multiple = tp * vocab_multiple
                shape[self.tp_dim] = math.ceil(size / multiple) * multiple // tp
            else:
                shape[self.tp_dim] = self.segments * math.ceil(size // self.segments / tp)
        return tuple(shape)


@dataclass(frozen=True)
class LayerShape:
    """The sizes of one block that activations and FLOPs depend on."""

    dim_model: int
    num_heads: int
    num_kv_heads: int
    dim_head: int
    hidden_dim: int
    feedforward: str  # "mlp", "glu" or "moe"
    num_experts: int
    top_k: int
    norm: str  # "layernorm" or "rmsnorm"
    rotary_dim: int  # 0 without rotary embeddings
    sdpa: bool  # torch's SDPA (fused kernels where the device has them); False: scores computed explicitly
    attention_dropout: bool  # dropout on the attention probabilities (SDPA on a CPU then keeps the scores)
    causal: bool
    cross_attention: bool  # an encoder-decoder's decoder layer: it also attends to the encoder's output
    residual_dropouts: int  # attention output dropouts with p > 0 (each keeps a mask of the width)
    hidden_dropout: bool  # dropout on the feedforward's hidden activation (a mask of its width)
    post_norm: bool  # the norms follow the residual adds (post-norm): the layer's input is kept apart
    fused_qkv: bool  # q, k and v come from one projection (``qkv_proj``), not three
    matmul_params: int  # parameters that take part in a matmul for every token (experts: top_k of them)

    @property
    def attentions(self) -> int:
        """Attention modules in the layer: self-attention, and cross-attention in a decoder layer."""
        return 2 if self.cross_attention else 1


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: the planner caches per model
class ModelFacts:
    """A spec's weights and layer shapes. ``weights`` holds each tied parameter once.

    ``kind`` is the spec's ``model``; ``causal_lm`` says it is brickwork's decoder LM, whose causal-LM
    step fuses its head and loss; ``decoder_start`` is the index of an encoder-decoder's first decoder
    layer; the embedding has a norm (``embedding_norm``) and a dropout (``embedding_dropout``), the
    layers a final norm (``final_norm``); ``head_params`` the matmul weights of the head (LM,
    masked-LM or classifier head);
    ``head_vocab`` the columns of its output (the vocabulary, or the classes), split by tensor
    parallel when ``head_split``; an image encoder's head reads one token per image
    (``pooled_head``) and its sequence is its ``fixed_seq_len`` patches. ``sequence_parallel_refused``
    and ``context_parallel_refused`` say why ``parallelize`` would refuse the model sequence or
    context parallel (None where it takes them): its own checks' words. ``balance_costs`` and
    ``balance_head`` are the layers' and the head's costs ``parallelize`` balances pipeline stages on
    (parallel/pipeline/stages.py), so the planner places them where it does.
    """

    weights: tuple[Weight, ...]
    layers: tuple[LayerShape, ...]
    vocab_size: int
    dim_model: int
    max_seq_len: int | None
    kind: str
    causal_lm: bool
    decoder_start: int | None = None
    head_params: int = 0
    head_vocab: int = 0
    head_split: bool = False
    pooled_head: bool = False
    fixed_seq_len: int | None = None
    embedding_norm: bool = False
    embedding_dropout: bool = False
    final_norm: bool = True
    sequence_parallel_refused: str | None = None
    context_parallel_refused: str | None = None
    balance_costs: tuple[float, ...] = ()
    balance_head: float = 0.0

    @cached_property
    def uniform_layers(self) -> bool:
        """Whether every layer has the same shape (then a stage's cost is its layer count's)."""
        return len(set(self.layers)) <= 1

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_parameters(self) -> int:
        return sum(math.prod(w.shape) for w in self.weights)


def model_facts(spec: Any) -> ModelFacts:
    """Read ``spec`` (a dict, a .yaml/.json path or a preset name) into :class:`ModelFacts`."""
    from brickwork.factory import build_model
    from brickwork.factory.presets import PRESETS

    if isinstance(spec, str) and spec in PRESETS:
        spec = PRESETS[spec]
    with torch.device("meta"):  # checks the spec and sizes every weight, allocating nothing
        model = build_model(spec)
    if any(isinstance(m, _reversible_types()) for m in model.modules()):
        raise ConfigError("the planner does not cover reversible layers yet", "reversible")
    return _read(model)


def _reversible_types() -> tuple[type, ...]:
    from brickwork.blocks.reversible import ReversibleLayers

    return (ReversibleLayers,)


def _read(model: nn.Module) -> ModelFacts:
    from brickwork.blocks import DecoderLM
    from brickwork.parallel.pipeline.stages import balance_costs, stage_recipe

    recipe = stage_recipe(model)
    units = recipe.units()
    index = {f"{stack}.{i}": n for n, (stack, i) in enumerate(units)}
    decoder_start = index.get(f"{recipe.stacks[-1]}.0") if len(recipe.stacks) > 1 else None
    places = {FIRST: set(recipe.outer_modules([], True, False)), LAST: set(recipe.head_modules())}
    if decoder_start is not None:
        places[DECODER_START] = set(recipe.outer_modules([units[decoder_start]], False, False))
    vocab = int(model.spec.get("vocab_size", 0))
    weights = _weights(model, index, places)
    head_params, head_vocab = _head(model, places[LAST], vocab)
    image = hasattr(model, "patch_embedding")
    fixed = (
        getattr(model.patch_embedding, "num_patches", 0) + (model.class_token is not None) if image else None
    )
    stacks = [model.get_submodule(stack) for stack in recipe.stacks]
    shapes = tuple(_layer_shape(layer) for stack in stacks for layer in stack)
    costs, head = balance_costs(model, recipe)
    return ModelFacts(
        weights=weights,
        layers=shapes,
        vocab_size=vocab,
        dim_model=shapes[0].dim_model,
        max_seq_len=fixed if image else model.spec.get("max_seq_len"),
        kind=model.spec["model"],
        causal_lm=isinstance(model, DecoderLM),
        decoder_start=decoder_start,
        head_params=head_params,
        head_vocab=head_vocab,
        head_split=any(w.tp_dim is not None and LAST in w.places and w.vocab for w in weights),
        pooled_head=image,
        fixed_seq_len=fixed,
        embedding_norm=_has_weights(getattr(model, "embedding_norm", None)),
        embedding_dropout=_drops(getattr(model, "dropout", None)),
        final_norm=any(_has_weights(getattr(model, n, None)) for n in ("final_norm", "decoder_final_norm")),
        **_refusals(model),
        balance_costs=costs,
        balance_head=head,
    )


def _refusals(model: nn.Module) -> dict[str, str | None]:
    """Why ``parallelize`` would refuse ``model`` sequence or context parallel, by its own checks."""
    from brickwork.parallel.context_parallel import check_context_parallel
    from brickwork.parallel.tensor.checks import check_sequence_parallel

    checks = {
        "sequence_parallel_refused": lambda: check_sequence_parallel(model, set()),
        "context_parallel_refused": lambda: check_context_parallel(model, 2),
    }
    out: dict[str, str | None] = {}
    for name, check in checks.items():
        try:
            check()
            out[name] = None
        except ConfigError as err:
            out[name] = err.reason
    return out


def _aliases(model: nn.Module) -> dict[int, list[str]]:
    """Every name each parameter goes by (a tied one has several): it sits wherever one of them does."""
    aliases: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(param), []).append(name)
    return aliases


def _weights(model: nn.Module, index: dict[str, int], places: dict[str, set[str]]) -> tuple[Weight, ...]:
    """Each parameter once: its layer (by ``index``, "stack.i" to its place in the run of layers) or
    the outer ``places`` it sits in, and how its component's TP plan splits it."""
    from brickwork.parallel.tensor.plan import component_plan

    styles = {entry.path: (entry.style, entry.segments) for entry in component_plan(model)}
    aliases = _aliases(model)
    weights = []
    for name, param in model.named_parameters():  # tied parameters once
        module_path, _, leaf = name.rpartition(".")
        style, segments = styles.get(module_path, ("replicate", 1))
        tp_dim = {"colwise": 0, "vocab": 0}.get(style, 1 if style == "rowwise" and leaf == "weight" else None)
        names = aliases[id(param)]
        layer = next((index[u] for u in (".".join(n.split(".")[:2]) for n in names) if u in index), -1)
        where = frozenset(p for p, tops in places.items() for n in names if n.split(".")[0] in tops)
        weights.append(
            Weight(
                name,
                tuple(param.shape),
                layer,
                where if layer < 0 else frozenset(),
                tp_dim,
                segments or 1,
                vocab=style == "vocab" or module_path == "lm_head",
                expert=".experts." in name,
            )
        )
    return tuple(weights)


def _head(model: nn.Module, head_modules: set[str], vocab: int) -> tuple[int, int]:
    """(the head's matmul weights, the columns of its output): the vocabulary's rows of a vocabulary
    head, not its padding ones (``vocab_multiple``), as model FLOPs count them."""
    names = {name for name, _ in model.named_modules() if name.split(".")[0] in head_modules}
    aliases = _aliases(model)
    params = columns = 0
    for param in dict.fromkeys(model.parameters()):
        if param.dim() == 2 and any(n.rpartition(".")[0] in names for n in aliases[id(param)]):
            rows = min(param.shape[0], vocab) if vocab else param.shape[0]
            params += rows * param.shape[1]
            columns = max(columns, rows)
    return params, columns


def _has_weights(module: nn.Module | None) -> bool:
    return module is not None and any(True for _ in module.parameters())


def _layer_shape(layer: nn.Module) -> LayerShape:
    attention, feedforward = layer.attention, layer.feedforward
    dim = int(attention.dim_model)
    heads = int(getattr(attention, "num_heads", 1))
    kind = (
        "moe"
        if hasattr(feedforward, "num_experts")
        else "glu"
        if hasattr(feedforward, "gate_proj")
        else "mlp"
    )
    experts = int(getattr(feedforward, "num_experts", 1))
    top_k = int(getattr(feedforward, "top_k", 1))
    params = sum(p.numel() for n, p in layer.named_parameters() if p.dim() >= 2 and ".experts." not in n)
    expert_params = sum(p.numel() for n, p in layer.named_parameters() if ".experts." in n)
    attentions = [attention, getattr(layer, "cross_attention", None)]
    mechanism = getattr(attention, "mechanism", None)
    return LayerShape(
        dim_model=dim,
        num_heads=heads,
        num_kv_heads=int(getattr(attention, "num_kv_heads", heads) or heads),
        dim_head=int(getattr(attention, "dim_head", dim // heads)),
        hidden_dim=int(getattr(feedforward, "hidden_dim", 4 * dim)),
        feedforward=kind,
        num_experts=experts,
        top_k=top_k,
        norm="rmsnorm" if "RMS" in type(layer.attention_norm).__name__ else "layernorm",
        rotary_dim=int(getattr(getattr(attention, "rotary", None), "rotary_dim", 0) or 0),
        sdpa=type(mechanism).__name__ == "ScaledDotProduct" and mechanism.backend == "sdpa",
        attention_dropout=float(getattr(mechanism, "dropout", 0.0) or 0.0) > 0,
        causal=bool(getattr(attention, "causal", True)),
        cross_attention=attentions[1] is not None,
        residual_dropouts=sum(_drops(getattr(a, "dropout", None)) for a in attentions if a is not None),
        hidden_dropout=_drops(getattr(feedforward, "dropout", None)),
        post_norm=type(layer.residual).__name__ == "PostNormResidual",
        fused_qkv=bool(getattr(attention, "fused_qkv", False)),
        matmul_params=params + expert_params * top_k // max(experts, 1),
    )


def _drops(module: nn.Module | None) -> bool:
    return isinstance(module, nn.Dropout) and module.p > 0
