"""Devices and clusters for the planner: what a device can hold and compute, and how its ranks talk.

A device is described by its memory, its peak dense bf16, fp32 and float8 matmul rates (no float8
on an A100), the fraction of peak that large training matmuls reach, the fraction torch's fused
attention kernels reach where it differs (an H100's), the memory the runtime takes before any tensor
(CUDA context, NCCL and cuBLAS workspaces), its memory bandwidth (what element-wise work runs at), and
the bandwidths that collectives reach inside a node (NVLink) and between nodes (the network, per
device). Those are bus bandwidths as NCCL's own tests report them for large messages, not link
peaks. The presets carry the vendor's peak rates. Each preset's achievable fractions are fitted once,
to published runs on that device (docs/parallel.md, "Against published runs"): the A100's 0.60 to
Table 1 of Narayanan et al. 2021 (ten GPT runs on up to 3072 A100-80GB); the H100's 0.57 for
matmuls and 0.30 for SDPA's attention kernels together to Megatron-LM's H100 weak-scaling table
(nine GPT runs on up to 6144 GPUs), torchtitan's Llama 3 benchmarks and this project's GPT-2 runs on
one H100, which they meet within 15% but for the runs the docs explain (Meta's Llama 3 405B at 8K
tokens, -18% and -20%; torchtitan's with context parallel over 2 to 8 ranks, +26% to +48%). The
attention fraction agrees with FlashAttention-2's published 0.35 on an H100 and this project's
profile of cuDNN attention (0.29). The H200 is the H100's chip with more and faster memory, so it
takes the H100's fractions, which this project's compiled GPT-2 small on one H200 meets at -7.5%
(450,655 tokens/s measured); the one public H200 training benchmark found (torchtitan's Llama 3.1 8B
in Float8 on 32 and 64 H200s) ran 16% and 15% faster than that (-15.9%, -14.7%).

:func:`running_preset` finds the preset of the GPU a process computes on (``brickwork train`` divides
by its peak for the MFU it logs, ``dist: auto`` plans with its rates).

A cluster string is ``"8xH100-80GB"`` (one node of 8), ``"48x8xA100-80GB"`` (48 nodes of 8) or a
bare name (one device); a list of device descriptions makes a mixed cluster.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any

import torch

from brickwork.checks import InRange, PositiveFloat
from brickwork.errors import ConfigError
from brickwork.option_types import CheckedConfig, construct

GiB = 1024**3
MiB = 1024**2
TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class Device(CheckedConfig):
    """One accelerator (or a CPU standing in for one). Rates in FLOP/s, bandwidths in bytes/s."""

    name: str
    memory_bytes: Annotated[int, InRange(0, open_low=True)]
    peak_flops_bf16: PositiveFloat
    peak_flops_fp32: PositiveFloat
    achievable_fraction: Annotated[float, InRange(0, 1, open_low=True)] = 0.6
    intra_node_bandwidth: PositiveFloat = 240 * GIGA
    inter_node_bandwidth: PositiveFloat = 23 * GIGA
    reserved_bytes: int = 0
    memory_bandwidth: PositiveFloat = 2000 * GIGA
    triton_kernels: bool = True
    node: int = 0
    multiprocessors: int = 132  # SMs; NCCL's kernels take some of them beside compute
    peak_flops_fp8: Annotated[float, InRange(0)] = 0.0  # dense float8 matmuls; 0: it has none
    # Fused (flash) attention kernels' fraction of the bf16 peak, their backward counted at 2.5 times
    # the forward's FLOPs as the kernels' own benchmarks count it (it recomputes the scores); 0: they
    # run like the matmuls, at the achievable fraction, their backward at twice the forward.
    attention_fraction: Annotated[float, InRange(0, 1)] = 0.0

    def float8_rate(self) -> float:
        """FLOP/s this device sustains on float8 training matmuls (the same fraction of its float8
        peak as of its bf16 one); 0 without float8 matmuls."""
        return self.peak_flops_fp8 * self.achievable_fraction

    def peak_flops(self, precision: str) -> float:
        """The dense peak FLOP/s of matmuls at the train step's ``precision``: the fp32 peak for
        ``fp32`` (brickwork leaves torch's TF32 switch off, so fp32 matmuls run in fp32), the bf16 peak
        for ``bf16``, ``bf16-mixed`` and ``fp16`` (whose matmuls run in 16 bits, at the same peak on
        the presets' devices) and ``fp8``, whose float8 matmuls count apart (:meth:`float8_rate`)."""
        return self.peak_flops_fp32 if precision == "fp32" else self.peak_flops_bf16

    def rate(self, precision: str) -> float:
        """FLOP/s this device sustains on training matmuls at ``precision``."""
        return self.peak_flops(precision) * self.achievable_fraction

    def attention_rate(self, precision: str) -> float:
        """FLOP/s its fused attention kernels sustain at ``precision`` (float8 runs them in bf16), by
        their own count (:attr:`attention_fraction`); the matmul rate where it has no fraction of
        its own."""
        fraction = self.attention_fraction or self.achievable_fraction
        return self.peak_flops(precision) * fraction


RUNTIME = 1536 * MiB  # CUDA context, NCCL buffers and cuBLAS workspace on a GPU
# Memory as nvidia-smi reports it; peaks from the vendor's data sheets (dense, no sparsity).
DEVICE_PRESETS: dict[str, Device] = {
    "A100-40GB": Device("A100-40GB", 40960 * MiB, 312 * TERA, 19.5 * TERA, 0.6, 240 * GIGA, 23 * GIGA,
                        RUNTIME, 1555 * GIGA, multiprocessors=108),
    "A100-80GB": Device("A100-80GB", 81920 * MiB, 312 * TERA, 19.5 * TERA, 0.6, 240 * GIGA, 23 * GIGA,
                        RUNTIME, 2039 * GIGA, multiprocessors=108),
    "H100-80GB": Device("H100-80GB", 81559 * MiB, 989 * TERA, 67 * TERA, 0.57, 360 * GIGA, 45 * GIGA,
                        RUNTIME, 3350 * GIGA, peak_flops_fp8=1979 * TERA, attention_fraction=0.30),
    "H200": Device("H200", 143771 * MiB, 989 * TERA, 67 * TERA, 0.57, 360 * GIGA, 45 * GIGA,
                   RUNTIME, 4800 * GIGA, peak_flops_fp8=1979 * TERA, attention_fraction=0.30),
}  # fmt: skip

# How torch.cuda.get_device_name spells each preset family's boards ("NVIDIA A100-SXM4-40GB", "NVIDIA
# A100 80GB PCIe", "NVIDIA H100 80GB HBM3", "NVIDIA H200"). The presets carry the SXM boards' peaks;
# an A100 PCIe has the same, but an H100 PCIe (756 dense bf16 TFLOP/s) or NVL, or an H200 NVL, has
# lower ones, so those boards match no preset. A GH200 is not an H200 either: the word must stand alone.
_BOARD_NAMES = {
    "A100": re.compile(r"\bA100\b", re.IGNORECASE),
    "H100": re.compile(r"\bH100\b(?!.*\b(?:PCIe|NVL)\b)", re.IGNORECASE),
    "H200": re.compile(r"\bH200\b(?!.*\bNVL\b)", re.IGNORECASE),
}


def preset_for(device_name: str, memory_bytes: int) -> Device | None:
    """The preset of the GPU that torch calls ``device_name`` (``torch.cuda.get_device_name``), with
    ``memory_bytes`` of memory (its ``total_memory``, which tells a family's sizes apart: A100 40GB
    and 80GB), or None when no preset describes it."""
    for family, pattern in _BOARD_NAMES.items():
        if pattern.search(device_name):
            sizes = [d for name, d in DEVICE_PRESETS.items() if name.split("-")[0] == family]
            return min(sizes, key=lambda d: abs(d.memory_bytes - memory_bytes))
    return None


def running_preset(device: torch.device) -> Device | None:
    """The preset of the device this process computes on; None on a CPU or a GPU no preset describes."""
    if device.type != "cuda":
        return None
    properties = torch.cuda.get_device_properties(device)
    return preset_for(properties.name, properties.total_memory)


# A user's device: these keys, in these units, over a preset's values (``preset``) or standalone.
_USER_KEYS = {
    "memory_gib": ("memory_bytes", GiB),
    "bf16_tflops": ("peak_flops_bf16", TERA),
    "fp32_tflops": ("peak_flops_fp32", TERA),
    "fp8_tflops": ("peak_flops_fp8", TERA),
    "achievable_fraction": ("achievable_fraction", 1.0),
    "attention_fraction": ("attention_fraction", 1.0),
    "intra_node_gbps": ("intra_node_bandwidth", GIGA),
    "inter_node_gbps": ("inter_node_bandwidth", GIGA),
    "reserved_gib": ("reserved_bytes", GiB),
    "memory_gbps": ("memory_bandwidth", GIGA),
}
_USER_REQUIRED = ("memory_gib", "bf16_tflops")


def device_from(description: str | Mapping[str, Any] | Device, path: str = "device") -> Device:
    """A preset name, a :class:`Device`, or a dict of ``name``, ``preset``, ``memory_gib``,
    ``bf16_tflops``, ``fp32_tflops``, ``fp8_tflops`` (0, the default without a preset: no float8
    matmuls), ``achievable_fraction``, ``attention_fraction`` (0, the default without a preset:
    attention at the matmuls' fraction), ``intra_node_gbps``,
    ``inter_node_gbps``, ``memory_gbps``, ``reserved_gib``, ``triton_kernels`` (false for a CPU: the
    norms then run as torch twins, which save more for backward) and ``node``."""
    if isinstance(description, Device):
        return description
    if isinstance(description, str):
        if description not in DEVICE_PRESETS:
            raise ConfigError("unknown device", path, choices=DEVICE_PRESETS, got=description)
        return DEVICE_PRESETS[description]
    if not isinstance(description, Mapping):
        raise ConfigError(f"a device is a preset name or a dict, got {description!r}", path)
    allowed = {"name", "preset", "node", "count", "triton_kernels", *_USER_KEYS}
    for key in description:
        if key not in allowed:
            raise ConfigError("unknown device key", f"{path}.{key}", choices=allowed, got=key)
    if "preset" in description:
        base = dataclasses.asdict(device_from(description["preset"], f"{path}.preset"))
    else:
        missing = [k for k in _USER_REQUIRED if k not in description]
        if missing:
            raise ConfigError(f"a device without a preset needs {missing}", path)
        base = {"name": "device"}
        base["peak_flops_fp32"] = float(description["bf16_tflops"]) * TERA
    for key, (field, unit) in _USER_KEYS.items():
        if key in description:
            value = description[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"must be a number, got {value!r}", f"{path}.{key}")
            base[field] = int(value * unit) if field.endswith("_bytes") else float(value * unit)
    base["name"] = str(description.get("name", base["name"]))
    base["triton_kernels"] = bool(description.get("triton_kernels", base.get("triton_kernels", True)))
    base["node"] = int(description.get("node", 0))
    return construct(Device, path, **base)


@dataclass(frozen=True)
class Cluster:
    """The devices in rank order (torchrun numbers ranks node by node)."""

    devices: tuple[Device, ...]

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @cached_property
    def uniform(self) -> bool:
        return len({dataclasses.replace(d, node=0) for d in self.devices}) == 1

    @cached_property
    def _peaks(self) -> dict[str, float]:
        return {p: sum(d.peak_flops(p) for d in self.devices) for p in ("fp32", "bf16")}

    def peak_flops(self, precision: str) -> float:
        """The dense peak FLOP/s of all devices together at ``precision`` (Device.peak_flops)."""
        return self._peaks["fp32" if precision == "fp32" else "bf16"]

    @cached_property
    def distinct(self) -> tuple[Device, ...]:
        """The devices, each kind once where the cluster is uniform (what a minimum or maximum over
        them reads)."""
        return self.devices[:1] if self.uniform else self.devices

    def same_node(self, ranks: Sequence[int]) -> bool:
        """Whether every rank of ``ranks`` sits on one node: the ranks go node by node, so the lowest
        and the highest rank's nodes say."""
        return self.devices[min(ranks)].node == self.devices[max(ranks)].node

    def describe(self) -> str:
        nodes: dict[int, list[str]] = {}
        for d in self.devices:
            nodes.setdefault(d.node, []).append(d.name)
        if self.uniform:
            per_node = len(next(iter(nodes.values())))
            name = self.devices[0].name
            return f"{per_node}x{name}" if len(nodes) == 1 else f"{len(nodes)}x{per_node}x{name}"
        return ", ".join(f"node {n}: " + "+".join(names) for n, names in sorted(nodes.items()))


_CLUSTER = re.compile(r"^(?:(\d+)x)?(?:(\d+)x)?(.+)$")


def parse_cluster(cluster: str | Sequence[Any] | Cluster) -> Cluster:
    """``"8xH100-80GB"``, ``"48x8xA100-80GB"``, ``"A100-80GB"`` or a list of device descriptions
    (a preset name or a dict; ``count`` repeats one, ``node`` says which node it sits on, default 0)."""
    if isinstance(cluster, Cluster):
        return cluster
    if isinstance(cluster, str):
        match = _CLUSTER.match(cluster.strip())
        first, second, name = match.groups() if match else (None, None, cluster)
        if second is not None:
            nodes, per_node = int(first), int(second)
        else:
            nodes, per_node = 1, int(first) if first is not None else 1
        if nodes < 1 or per_node < 1:
            raise ConfigError(f"needs at least one node and one device per node, got {cluster!r}", "cluster")
        device = device_from(name, "cluster")
        return Cluster(
            tuple(dataclasses.replace(device, node=n) for n in range(nodes) for _ in range(per_node))
        )
    if not isinstance(cluster, Sequence) or not cluster:
        raise ConfigError(
            f"a cluster is a string such as '8xH100-80GB' or a non-empty list of devices, got {cluster!r}",
            "cluster",
        )
    devices = []
    for index, item in enumerate(cluster):
        count = item.get("count", 1) if isinstance(item, Mapping) else 1
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"must be an integer >= 1, got {count!r}", f"cluster.{index}.count")
        devices += [device_from(item, f"cluster.{index}")] * count
    devices.sort(key=lambda d: d.node)  # ranks go node by node
    return Cluster(tuple(devices))
