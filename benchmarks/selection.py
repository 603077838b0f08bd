"""Which kernel cases a sweep times: the flags ``python -m benchmarks`` and ``brickwork bench`` share.

Kept free of torch and of the kernels, so that building the ``brickwork`` command line imports
nothing heavy (``brickwork train`` must choose Triton's interpreter before Triton is imported).
"""

from __future__ import annotations

import argparse

from brickwork.errors import ConfigError

KERNELS = ("layer_norm", "rms_norm", "bias_gelu", "masked_softmax")
PROVIDERS = ("brickwork", "torch", "torch.compile", "liger", "apex")
DTYPE_NAMES = ("bfloat16", "float16", "float32")
MODES = ("forward", "backward", "forward+backward")


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """The kernel sweep's flags; each left out takes the device's default (runner.GPU_DEFAULTS)."""
    parser.add_argument("--kernels", nargs="+", choices=KERNELS, default=list(KERNELS), help="default: all")
    parser.add_argument(
        "--providers", nargs="+", choices=PROVIDERS, help="default: all on GPU; brickwork and torch on CPU"
    )
    parser.add_argument("--dtypes", nargs="+", choices=DTYPE_NAMES, help="default: bfloat16 float32 (GPU)")
    parser.add_argument("--widths", nargs="+", type=int, help="row widths; default 1024 ... 65536 on GPU")
    parser.add_argument("--rows", type=int, help="rows per input; default 4096 on GPU, 256 on CPU")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="default: all")
    parser.add_argument("--fresh", action="store_true", help="replace earlier results instead of merging")
    parser.add_argument("--no-plot", action="store_true", help="skip the matplotlib plot")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU runs only: torch threads (default 1, steadier on shared hosts)",
    )


def check_selection(args: argparse.Namespace) -> None:
    """Refuses a width, row count or thread count below 1, naming the flag."""
    for flag, values in (
        ("--widths", args.widths or []),
        ("--rows", [args.rows or 1]),
        ("--threads", [args.threads]),
    ):
        bad = [v for v in values if v < 1]
        if bad:
            raise ConfigError(f"must be positive integers, got {bad[0]}", flag)
