"""Compiles every Triton kernel to PTX and a cubin for an sm_90 GPU, with no GPU present.

Run as a script (by ``test_gpu_codegen.py``) in a process where ``TRITON_INTERPRET`` is unset, so that
``@triton.jit`` gives real JIT functions. The interpreter runs kernels with numpy and accepts code that
the compiler rejects; this catches that. Prints one JSON line: per case, the error or None, and
whether the PTX uses correctly rounded division and square root.
"""

import json
import os
import re
import warnings

os.environ.pop("TRITON_INTERPRET", None)
warnings.filterwarnings("ignore")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from brickwork.kernels.fused import bias_gelu, cross_entropy, layer_norm, masked_softmax, rms_norm  # noqa: E402

FLOAT_ARGS = {"eps", "scale", "keep_scale"}
FLOAT32_POINTERS = {"mean_ptr", "rstd_ptr", "dweight_ptr", "dbias_ptr", "row_sums_ptr", "loss_ptr"}


def _signature(fn, constexprs: dict, pointers: dict) -> dict:
    """bf16 data, float32 statistics and partial sums, int64 strides and seeds, int32 sizes."""
    signature = {}
    for name in fn.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*fp32" if name in FLOAT32_POINTERS else "*bf16")
        elif name in FLOAT_ARGS:
            signature[name] = "fp32"
        else:
            signature[name] = "i64" if "stride" in name or name == "seed" else "i32"
    return signature


def cases() -> list[tuple[str, object, dict, dict]]:
    norm = {"SINGLE_BLOCK": True, "BLOCK_N": 256}
    looped = {"SINGLE_BLOCK": False, "BLOCK_N": 16384}
    out = []
    for layout in (norm, looped):
        out += [
            (
                "layer_norm_fwd",
                layer_norm._layer_norm_fwd_kernel,
                {"HAS_WEIGHT": True, "HAS_BIAS": True} | layout,
                {},
            ),
            (
                "layer_norm_bwd",
                layer_norm._layer_norm_bwd_kernel,
                {"HAS_WEIGHT": True, "HAS_BIAS": True} | layout,
                {},
            ),
            ("rms_norm_fwd", rms_norm._rms_norm_fwd_kernel, {"HAS_WEIGHT": True} | layout, {}),
            ("rms_norm_bwd", rms_norm._rms_norm_bwd_kernel, {"HAS_WEIGHT": True} | layout, {}),
            (
                "masked_softmax_fwd",
                masked_softmax._masked_softmax_fwd_kernel,
                {"MASK": 1, "CAUSAL": True} | layout,
                {"mask_ptr": "*i1"},
            ),
            (
                "masked_softmax_bwd",
                masked_softmax._masked_softmax_bwd_kernel,
                {"MASK": 1, "CAUSAL": True} | layout,
                {"mask_ptr": "*i1"},
            ),
        ]
    gelu = {"HAS_BIAS": True, "TANH": True, "DROPOUT": True, "BLOCK_M": 4, "BLOCK_N": 1024}
    out += [
        ("bias_gelu_fwd", bias_gelu._bias_gelu_fwd_kernel, gelu, {}),
        ("bias_gelu_bwd", bias_gelu._bias_gelu_bwd_kernel, gelu, {}),
        (
            "cross_entropy_chunk",
            cross_entropy._cross_entropy_chunk_kernel,
            {"COMPUTE_GRAD": True, "BLOCK_V": 4096},
            {"labels_ptr": "*i64"},
        ),
    ]
    return out


def main() -> None:
    results = []
    for name, fn, constexprs, pointers in cases():
        source = ASTSource(fn=fn, signature=_signature(fn, constexprs, pointers), constexprs=constexprs)
        try:
            compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8})
        except Exception as exc:  # reported per case, so one failure does not hide the others
            results.append(
                {"case": name, "layout": constexprs, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            )
            continue
        ptx = compiled.asm["ptx"]
        rounded = {"div_rn": r"div\.rn\.f32", "sqrt_rn": r"sqrt\.rn\.f32"}
        found = {key: bool(re.search(pattern, ptx)) for key, pattern in rounded.items()}
        results.append({"case": name, "layout": constexprs, "error": None} | found)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
