"""FP8 training (``train.precision: fp8``): the layers' linears swapped for torchao's ``Float8Linear``.

A converted linear casts its input, weight and output gradient to float8 with a dynamic scale per
tensor (``tensorwise``: one scale each, cuBLAS's tensorwise kernel) or per row (``rowwise``: one scale
per row, rounded down to a power of two, CUTLASS's rowwise kernel), runs the three matmuls of forward
and backward in float8, and keeps its parameters as they were: fp32 master weights, plain tensors in
the state dict. Everything else runs in bf16, as ``bf16-mixed`` does (precision.py).

Only the linears inside the model's layer stacks are candidates (the regions parallel/compile.py
compiles): the embeddings, the final norm and the LM head, which the fused head loss reads as a
whole weight, stay outside, and so does a mixture of experts' router, whose logits choose the
experts. Among the candidates a small linear stays in bf16 too, because float8's casts cost more
than its matmul saves (:func:`fp8_filter`).

On CUDA the float8 matmuls need compute capability 8.9 or newer (Ada, Hopper); anywhere else
torchao emulates them (``emulate=True``: the same casts and scales, the matmul in high precision), so
a CPU run trains with float8's rounding but none of its speed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import torch
from torch import nn

from brickwork.components.feedforward.moe import MixtureOfExperts
from brickwork.errors import ConfigError
from brickwork.extras import missing_package
from brickwork.parallel.activation_checkpointing import layer_stacks
from brickwork.parallel.config import ParallelConfig
from brickwork.parallel.mesh import mesh_device_type

FP8_RECIPES = ("tensorwise", "rowwise")
# Float8 tensor cores: Ada (8.9) and Hopper (9.0) onwards.
MIN_CAPABILITY = (8, 9)
# The float8 GEMMs take only dimensions that are multiples of 16.
FP8_ALIGNMENT = 16


def check_torchao(option: str = "precision") -> None:
    """ConfigError at ``option`` naming the extra that installs torchao, where it is missing."""
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(missing_package("torchao", "precision fp8"), option)


def check_fp8_device(device: torch.device) -> None:
    """ConfigError where ``device`` is a GPU without float8 matmuls (below compute capability 8.9)."""
    if device.type != "cuda":
        return
    if torch.version.hip is not None:
        # ROCm reports its own architecture numbers as the capability, and its float8 formats differ.
        raise ConfigError(
            "fp8 is built on NVIDIA's float8 matmuls; on ROCm train with bf16-mixed", "precision"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise ConfigError(
            f"fp8 needs float8 matmuls, which CUDA devices have from compute capability "
            f"{'.'.join(map(str, MIN_CAPABILITY))} (Ada, Hopper) on; {name} is "
            f"{'.'.join(map(str, capability))}: train it with precision bf16-mixed",
            "precision",
        )


def fp8_filter(recipe: str, min_features: int | None) -> Callable[[nn.Module, str], bool]:
    """Whether a linear is worth converting: ``(module, name) -> bool``.

    ``min_features=None`` takes torchao's rule for the recipe, from its H100 benchmarks (torchao
    ``_auto_filter_for_recipe``): both dimensions multiples of 16, and for ``tensorwise`` not
    (in <= 4096 and out <= 1024), for ``rowwise`` out > 2048, in > 1024 and not (out <= 4096 and
    in <= 2048). Below those sizes float8 runs slower than bf16: in torchtitan issue #1207 Llama 3's
    small k/v projections got about 40% slower in rowwise fp8. An integer converts a
    linear whose in and out features are both multiples of 16 and at least ``min_features``.
    """
    if min_features is None:
        from torchao.float8 import _auto_filter_for_recipe

        return _auto_filter_for_recipe(recipe, filter_fqns=[])

    def wanted(module: nn.Module, name: str) -> bool:
        sizes = (module.in_features, module.out_features)
        return all(size % FP8_ALIGNMENT == 0 and size >= min_features for size in sizes)

    return wanted


def fp8_candidates(model: nn.Module, recipe: str, min_features: int | None) -> list[str]:
    """The names of the linears :func:`convert_to_fp8` converts: every exact ``nn.Linear`` inside the
    model's layer stacks that :func:`fp8_filter` picks, but a mixture of experts' router. Works on a
    model built on the meta device."""
    wanted = fp8_filter(recipe, min_features)
    routers = {id(m.router) for m in model.modules() if isinstance(m, MixtureOfExperts)}
    names = {id(child): name for name, child in model.named_children()}
    chosen = []
    for stack in layer_stacks(model):
        for name, module in stack.named_modules(prefix=names[id(stack)]):
            # Exactly nn.Linear: a subclass (a converted layer among them) keeps its own forward.
            if type(module) is nn.Linear and id(module) not in routers and wanted(module, name):
                chosen.append(name)
    return chosen


def convert_to_fp8(
    model: nn.Module,
    recipe: str = "tensorwise",
    *,
    min_features: int | None = None,
    device: torch.device,
    fsdp_float8_all_gather: bool = False,
) -> list[str]:
    """Swap the linears :func:`fp8_candidates` names for torchao's ``Float8Linear``, in place;
    returns their names. Run it before ``parallelize``: tensor parallel, compilation and FSDP then
    wrap the converted layers, as torchao requires.

    ``device`` is where the model will train: float8 matmuls on a CUDA device of compute capability
    8.9 or newer, emulated elsewhere. ``fsdp_float8_all_gather`` (tensorwise only) has FSDP2 gather
    the weights already cast to float8, half the bytes of bf16.
    """
    if recipe not in FP8_RECIPES:
        raise ConfigError(f"unknown fp8 recipe {recipe!r}", "fp8_recipe", choices=FP8_RECIPES, got=recipe)
    if fsdp_float8_all_gather and recipe != "tensorwise":
        raise ValueError("only the tensorwise recipe gathers float8 weights: its one scale per tensor")
    check_torchao()
    check_fp8_device(device)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = dataclasses.replace(
        Float8LinearConfig.from_recipe_name(recipe),
        emulate=device.type != "cuda",
        enable_fsdp_float8_all_gather=fsdp_float8_all_gather,
    )
    chosen = set(fp8_candidates(model, recipe, min_features))
    names = {id(child): name for name, child in model.named_children()}
    for stack in layer_stacks(model):
        prefix = names[id(stack)]
        convert_to_float8_training(
            stack, module_filter_fn=lambda _, name, prefix=prefix: f"{prefix}.{name}" in chosen, config=config
        )
    return sorted(chosen)


def is_fp8(model: nn.Module) -> bool:
    """Whether :func:`convert_to_fp8` converted a linear of ``model``."""
    if importlib.util.find_spec("torchao") is None:
        return False
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


def convert_for_layout(
    model: nn.Module, recipe: str | None, min_features: int | None, config: ParallelConfig
) -> list[str]:
    """``train.precision: fp8``: :func:`convert_to_fp8` for the device and layout of ``config``, before
    ``parallelize`` applies it; returns the converted names. Under FSDP2 (zero_stage 2/3) the
    tensorwise recipe gathers float8 weights; rowwise gathers bf16 ones (FSDP's MixedPrecisionPolicy)
    and casts them row by row after the gather, since its scales need whole rows."""
    recipe = recipe or "tensorwise"
    device = torch.device(mesh_device_type(config))
    gather_fp8 = recipe == "tensorwise" and config.zero_stage >= 2
    return convert_to_fp8(
        model, recipe, min_features=min_features, device=device, fsdp_float8_all_gather=gather_fp8
    )


def check_fp8_run(
    model: nn.Module, recipe: str | None, min_features: int | None, device: torch.device
) -> None:
    """ConfigError where an fp8 run of ``model`` (built on the meta device will do) on ``device``
    cannot train in float8: a GPU without float8 matmuls, or no linear of the layers large enough."""
    check_fp8_device(device)
    recipe = recipe or "tensorwise"
    if not fp8_candidates(model, recipe, min_features):
        rule = f"{min_features} features" if min_features is not None else f"torchao's {recipe} size rule"
        raise ConfigError(
            f"no linear of the model's layers reaches {rule}, so fp8 would train as bf16-mixed: "
            "set a smaller fp8_min_features, or train with precision bf16-mixed",
            "fp8_min_features",
        )
