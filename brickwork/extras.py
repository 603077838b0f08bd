"""The optional packages brickwork imports for one feature each, and the extra that installs each.

``pip install brickwork`` brings torch, numpy, pyyaml, safetensors and tqdm: enough to build, train
and sample on any machine. A feature that needs more says which extra to install (pyproject.toml
declares them), in one line, when it is asked for.
"""

from __future__ import annotations

# package -> the extra of pyproject.toml that installs it
EXTRAS = {
    "triton": "triton",
    "transformers": "hf",
    "accelerate": "hf",
    "tokenizers": "tokenizers",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "matplotlib": "plot",
    "torchao": "fp8",
}


def install_hint(package: str) -> str:
    """``pip install 'brickwork[EXTRA]'`` for an optional ``package``."""
    return f"pip install 'brickwork[{EXTRAS[package]}]'"


def missing_package(package: str, needed_for: str) -> str:
    """The one line saying that ``needed_for`` needs ``package`` and how to install it."""
    return f"{needed_for} needs the {package} package, which is not installed: {install_hint(package)}"
