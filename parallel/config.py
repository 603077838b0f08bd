"""The dist dict: one plain dict that says how a model runs on N processes, validated into ParallelConfig.

LiBai's spellings are accepted as they are: its ``dist`` keys (``data_parallel_size``,
``tensor_parallel_size``, ``pipeline_parallel_size``, ``pipeline_num_layers``,
``custom_pipeline_stage_id``, ``device_type``) and its training switches
``zero_optimization={"enabled", "stage"}``, ``activation_checkpoint={"enabled"}`` and
``amp={"enabled"}`` (LiBai's amp is fp16). ``from_dict`` translates them into brickwork's keys, which
``to_config`` then checks like any config's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from brickwork.checks import Flag, InRange, OneOf, PositiveInt
from brickwork.errors import ConfigError
from brickwork.option_types import CheckedConfig, to_config
from brickwork.parallel.tensor.parts import check_parts

ACTIVATION_CHECKPOINTING = ("none", "full", "selective")
MIXED_PRECISION = ("fp32", "bf16", "fp16")
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
ZERO_STAGES = (0, 1, 2, 3)
DEVICE_TYPES = ("cpu", "cuda")


class WorldSizeError(ConfigError):
    """A valid dist dict (``config``) whose sizes multiply to ``wanted`` processes, launched on ``have``."""

    def __init__(self, message: str, *, config: ParallelConfig, wanted: int, have: int) -> None:
        super().__init__(message)
        self.config, self.wanted, self.have = config, wanted, have


def _check_layer_counts(value: object, option: str) -> None:
    if not isinstance(value, tuple | list) or any(
        isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in value
    ):
        raise ConfigError(f"must be layer counts >= 1 per stage, got {value!r}", option)


def _check_weights(value: object, option: str) -> None:
    numbers = isinstance(value, tuple | list) and all(isinstance(w, int | float) for w in value)
    if not numbers or any(isinstance(w, bool) or w <= 0 for w in value):
        raise ConfigError(f"must be positive numbers (relative speeds), got {value!r}", option)


@dataclass(frozen=True)
class ParallelConfig(CheckedConfig):
    """A validated dist dict. Sizes multiply to the world size; see docs/parallel.md for every key."""

    data_parallel_size: PositiveInt = 1
    tensor_parallel_size: PositiveInt = 1
    pipeline_parallel_size: PositiveInt = 1
    context_parallel_size: PositiveInt = 1
    sequence_parallel: Flag = False
    zero_stage: Annotated[int, OneOf(ZERO_STAGES)] = 0
    cpu_offload: Flag = False
    activation_checkpointing: Annotated[str, OneOf(ACTIVATION_CHECKPOINTING)] = "none"
    mixed_precision: Annotated[str, OneOf(MIXED_PRECISION)] = "fp32"
    num_microbatches: PositiveInt | None = None
    pipeline_schedule: Annotated[str, OneOf(PIPELINE_SCHEDULES)] = "1f1b"
    virtual_pipeline_size: PositiveInt = 1
    pipeline_layers: Annotated[tuple[int, ...], _check_layer_counts] | None = None
    pipeline_num_layers: PositiveInt | None = None
    device_weights: Annotated[tuple[float, ...], _check_weights] | None = None
    device_type: Annotated[str, OneOf(DEVICE_TYPES)] | None = None
    parts: tuple[tuple[str, str], ...] = ()
    vocab_multiple: PositiveInt = 64
    expert_parallel_size: PositiveInt = 1
    # Every collective and the start waits at most this long for a peer that stopped or never came.
    timeout_s: Annotated[float, InRange(0, 10**7, open_low=True, open_high=True)] = 600.0

    def check_options(self) -> None:
        """The rules spanning keys (each key's own check sits on its field)."""
        if self.cpu_offload and self.zero_stage < 2:
            raise ConfigError(
                f"cpu_offload needs FSDP, i.e. zero_stage 2 or 3, got zero_stage={self.zero_stage}",
                "cpu_offload",
            )
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            raise ConfigError("sequence_parallel needs tensor_parallel_size > 1", "sequence_parallel")
        self._check_pipeline()
        self._check_device_weights()
        self._check_parts()
        self._check_expert_parallel()

    @property
    def microbatches(self) -> int:
        """``num_microbatches``, by default the number of pipeline stages (1 without a pipeline)."""
        return self.num_microbatches if self.num_microbatches is not None else self.pipeline_parallel_size

    @property
    def num_stages(self) -> int:
        """Pipeline stages in all: pipeline_parallel_size × virtual_pipeline_size."""
        return self.pipeline_parallel_size * self.virtual_pipeline_size

    def _check_pipeline(self) -> None:
        pp, m, v = self.pipeline_parallel_size, self.microbatches, self.virtual_pipeline_size
        if v > 1 and self.pipeline_schedule != "interleaved_1f1b":
            raise ConfigError(
                f"virtual_pipeline_size={v} needs pipeline_schedule 'interleaved_1f1b', got "
                f"{self.pipeline_schedule!r}",
                "virtual_pipeline_size",
            )
        if pp > 1 and self.pipeline_schedule in ("1f1b", "interleaved_1f1b") and m < pp:
            # 1F1B's warm-up runs pp - 1 forwards before the first backward; fewer microbatches than
            # stages leave the schedule waiting for a microbatch that never comes.
            raise ConfigError(
                f"num_microbatches={m} is smaller than pipeline_parallel_size={pp}; "
                f"{self.pipeline_schedule} needs at least one microbatch per stage (or use 'gpipe')",
                "num_microbatches",
            )
        if pp > 1 and self.pipeline_schedule == "interleaved_1f1b" and m % pp:
            raise ConfigError(
                f"num_microbatches={m} is not a multiple of pipeline_parallel_size={pp}, which "
                "interleaved_1f1b needs (microbatches go round the stages in groups of pp)",
                "num_microbatches",
            )
        if self.pipeline_layers is not None and len(self.pipeline_layers) != self.num_stages:
            raise ConfigError(
                f"has {len(self.pipeline_layers)} entries but there are {self.num_stages} stages "
                f"(pipeline_parallel_size {pp} × virtual_pipeline_size {v})",
                "pipeline_layers",
            )

    def _check_device_weights(self) -> None:
        weights = self.device_weights
        if weights is None:
            return
        pp, dp = self.pipeline_parallel_size, self.data_parallel_size
        if pp > 1 and dp > 1:
            raise ConfigError(
                f"weights one dim at a time: per pipeline stage (pipeline_parallel_size={pp}, "
                f"data_parallel_size 1) or per data-parallel rank (data_parallel_size={dp}, "
                "pipeline_parallel_size 1)",
                "device_weights",
            )
        want, dim = (pp, "pipeline_parallel_size") if pp > 1 else (dp, "data_parallel_size")
        if len(weights) != want:
            raise ConfigError(f"has {len(weights)} entries but {dim}={want}", "device_weights")

    def _check_parts(self) -> None:
        check_parts(dict(self.parts))
        if self.parts and self.pipeline_parallel_size > 1:
            raise ConfigError("per-part strategies are not supported under a pipeline yet", "parts")
        if self.sequence_parallel and "replicate" in dict(self.parts).values():
            raise ConfigError(
                "a replicated part cannot take sequence-parallel activations (every layer must be split)",
                "parts",
            )

    def _check_expert_parallel(self) -> None:
        ep, dp = self.expert_parallel_size, self.data_parallel_size
        if dp % ep:
            raise ConfigError(
                f"expert_parallel_size={ep} must divide data_parallel_size={dp} (experts are split over "
                "groups of that many data-parallel ranks)",
                "expert_parallel_size",
            )
        if ep > 1 and self.pipeline_parallel_size > 1:
            raise ConfigError("expert parallel is not supported under a pipeline yet", "expert_parallel_size")
        if ep > 1 and self.context_parallel_size > 1:
            # Context-parallel peers route different tokens to the same experts: the experts would
            # need their gradients reduced over edp × cp, which the expert mesh does not lay out yet.
            raise ConfigError(
                "expert parallel is not supported with context_parallel_size > 1 yet", "expert_parallel_size"
            )

    @property
    def mesh_shape(self) -> tuple[int, int, int, int]:
        """(pp, dp, cp, tp): the sizes of the device mesh's dims, in order (parallel/mesh.py)."""
        pp, dp = self.pipeline_parallel_size, self.data_parallel_size
        return pp, dp, self.context_parallel_size, self.tensor_parallel_size

    @property
    def world_size(self) -> int:
        """pp × dp × cp × tp: the number of processes this layout needs."""
        return math.prod(self.mesh_shape)

    def check_world_size(self, world_size: int) -> None:
        """Raise ConfigError, naming every number, unless pp × dp × cp × tp equals ``world_size``."""
        if self.world_size != world_size:
            raise WorldSizeError(
                f"pipeline_parallel_size ({self.pipeline_parallel_size}) × data_parallel_size "
                f"({self.data_parallel_size}) × context_parallel_size ({self.context_parallel_size}) × "
                f"tensor_parallel_size ({self.tensor_parallel_size}) = {self.world_size}, but the world "
                f"size is {world_size}",
                config=self,
                wanted=self.world_size,
                have=world_size,
            )

    def to_dict(self) -> dict[str, Any]:
        """The resolved dist dict, in brickwork's own spellings (lists for tuples)."""
        out = dataclasses.asdict(self)
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}
        out["parts"] = dict(self.parts)
        return out

    @classmethod
    def from_dict(
        cls, dist: Mapping[str, Any] | ParallelConfig, world_size: int | None = None
    ) -> ParallelConfig:
        """Validate a dist dict (brickwork's or LiBai's spellings) without changing it.

        A missing ``data_parallel_size`` is inferred as ``world_size // (tp × cp × pp)`` when the world size
        is given, as LiBai does. With ``world_size`` the sizes are also checked against it.
        """
        if isinstance(dist, ParallelConfig):
            config = dist
        else:
            if not isinstance(dist, Mapping):
                raise ConfigError(f"the dist config must be a dict, got {type(dist).__name__}")
            config = to_config(cls, _resolve_keys(dict(dist), world_size))
        if world_size is not None:
            config.check_world_size(world_size)
        return config


DIST_KEYS = frozenset(f.name for f in dataclasses.fields(ParallelConfig))
LIBAI_KEYS = frozenset({"zero_optimization", "activation_checkpoint", "amp", "custom_pipeline_stage_id"})


def _resolve_keys(dist: dict[str, Any], world_size: int | None) -> dict[str, Any]:
    """``dist`` in brickwork's keys: LiBai's translated, the others passed on for ``to_config`` to check."""
    out: dict[str, Any] = {}
    for key, value in dist.items():
        if key == "zero_optimization":
            section = _section(key, value, ("enabled", "stage"))
            out["zero_stage"] = section.get("stage", 1) if section.get("enabled", False) else 0
        elif key == "activation_checkpoint":
            section = _section(key, value, ("enabled",))
            out["activation_checkpointing"] = "full" if section.get("enabled", False) else "none"
        elif key == "amp":
            section = _section(key, value, ("enabled",))
            out["mixed_precision"] = "fp16" if section.get("enabled", False) else "fp32"
        elif key == "custom_pipeline_stage_id":
            if value is not None:
                out["pipeline_layers"] = _stage_ids_to_counts(key, value)
        elif key == "parts":
            if not isinstance(value, Mapping):
                raise ConfigError(f"must be a dict of module-path glob -> strategy, got {value!r}", key)
            out["parts"] = tuple(value.items())
        elif key in DIST_KEYS:
            out[key] = value
        else:  # here, where LiBai's spellings are known, so that the closest of either is suggested
            raise ConfigError("unknown dist key", key, choices=sorted(DIST_KEYS | LIBAI_KEYS), got=key)
    if "data_parallel_size" not in out and world_size is not None:
        others_keys = ("tensor_parallel_size", "context_parallel_size", "pipeline_parallel_size")
        sizes = [out.get(k, 1) for k in others_keys]
        others = math.prod(sizes) if all(isinstance(v, int) for v in sizes) else 0
        if others > 0 and world_size % others == 0:
            out["data_parallel_size"] = world_size // others
    return out


def _section(key: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"enabled": value}
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be a dict with keys {list(allowed)}, got {value!r}", key)
    for sub in value:
        if sub not in allowed:
            raise ConfigError("unknown key", f"{key}.{sub}", choices=allowed, got=sub)
    return dict(value)


def _stage_ids_to_counts(key: str, stage_ids: Any) -> tuple[int, ...]:
    """LiBai's per-layer stage ids (e.g. [0, 0, 1, 1, 1]) as layers per stage ((2, 3))."""
    ids = list(stage_ids)
    if not ids or any(not isinstance(i, int) or i < 0 for i in ids) or ids != sorted(ids):
        raise ConfigError(f"must be a non-decreasing list of stage ids >= 0, got {stage_ids!r}", key)
    return tuple(ids.count(stage) for stage in range(ids[-1] + 1))
