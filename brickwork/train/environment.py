"""``brickwork info``: versions, devices, the kernel backend each op will use, components and presets."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform

import torch

import brickwork
from brickwork.train.threads import cpu_threads

KERNEL_OPS = ("layer_norm", "rms_norm", "bias_gelu", "masked_softmax")
REGISTRIES = (
    ("attention", "brickwork.components.attention", "ATTENTION_REGISTRY"),
    ("feedforward", "brickwork.components.feedforward", "FEEDFORWARD_REGISTRY"),
    ("positional", "brickwork.components.positional", "POSITIONAL_REGISTRY"),
    ("norm", "brickwork.components.residual", "NORM_REGISTRY"),
    ("residual", "brickwork.components.residual", "RESIDUAL_REGISTRY"),
)


# The distributions whose versions decide what the suite last passed with (see constraints.txt).
VERSIONED = ("torch", "triton", "transformers", "safetensors", "numpy", "tokenizers", "torchao")


def installed_versions() -> list[tuple[str, str]]:
    """(distribution, version or "not installed") for each of ``VERSIONED``, read without importing it."""
    out = []
    for name in VERSIONED:
        try:
            out.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            out.append((name, "not installed"))
    return out


def triton_status() -> str:
    """Whether and where Triton's kernels can run."""
    try:
        importlib.import_module("triton")
    except ImportError as err:
        return f"not importable ({err}); every op uses its torch twin"
    if torch.cuda.is_available():
        return "usable: kernels compile for the CUDA device"
    return (
        "importable; no GPU, so only backend='triton' runs it, through Triton's interpreter on CPU "
        "(chosen per process by brickwork.kernels.use_triton_interpreter(); brickwork train does it)"
    )


def kernel_backends() -> list[tuple[str, str, str]]:
    """(op, backend chosen for backend=None, why) for each fused kernel on this machine's default device.

    The choice is the kernels' own dispatch rule applied to a tensor on that device.
    """
    from brickwork.kernels.backend import use_triton

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if use_triton(None, torch.empty(0, device=device)):
        choice, why = "triton", "CUDA tensors go to the fused Triton kernel"
    elif device == "cuda":
        choice, why = "torch", "Triton is not installed, so CUDA tensors use the torch twin"
    else:
        choice, why = "torch", "no CUDA device; CPU tensors always use the exact torch twin"
    return [(op, choice, why) for op in KERNEL_OPS]


def registered_components() -> list[tuple[str, list[str]]]:
    """(family, registered names) for every component registry."""
    out = []
    for family, module, attribute in REGISTRIES:
        registry = getattr(importlib.import_module(module), attribute)
        out.append((family, registry.names()))
    return out


def environment_report() -> str:
    """The text ``brickwork info`` prints."""
    from brickwork.factory import list_presets

    triton_note = triton_status()
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        cuda = f"available: {torch.cuda.device_count()} device(s): {names}"
    else:
        built = "built with CUDA " + torch.version.cuda if torch.version.cuda else "a CPU-only build"
        cuda = f"not available (torch is {built})"
    train_threads = cpu_threads()
    lines = [
        "versions:",
        f"  brickwork     {brickwork.__version__}  ({os.path.dirname(brickwork.__file__)})",
        f"  python        {platform.python_version()}  ({platform.platform()})",
    ]
    lines += [f"  {name:<13} {version}" for name, version in installed_versions()]
    lines += [
        "",
        f"CUDA       {cuda}",
        f"CPU        {os.cpu_count()} cores; brickwork train computes with {train_threads.threads} "
        f"thread{'s' if train_threads.threads != 1 else ''} per process ({train_threads.reason}; "
        f"torch's count here: {torch.get_num_threads()})",
        f"Triton     {triton_note}",
        "",
        "kernel backends (backend=None):",
    ]
    lines += [f"  {op:<15} {choice:<7} {why}" for op, choice, why in kernel_backends()]
    lines += ["", "registered components:"]
    lines += [f"  {family:<12} {', '.join(names)}" for family, names in registered_components()]
    lines += ["", f"presets:     {', '.join(list_presets())}"]
    return "\n".join(lines)
