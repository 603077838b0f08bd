"""The one training step and the one evaluation, for a plain module or any layout ``parallelize`` made.

A step: agree on the batch within the tensor/pipeline-parallel group (brickwork/train/batch.py),
split it into ``grad_accum_steps`` micro-batches, run forward, the task's summed loss and backward on
each (gradients reduced over data parallel on the last one only), then scale the gradients by
dp / (count of the whole global batch), so they are those of the mean over every scored position of
the global batch however it is split over ranks and micro-batches. Then the optimizer step, with
dynamic loss scaling for fp16 (an overflowed step is skipped) and gradient clipping on the norm of
the full gradient. Under a pipeline the micro-batches become more pipeline microbatches of one
schedule (Megatron's way): num_microbatches × grad_accum_steps, reduced over dp once, at the end.
A built-in task first aligns the labels with the positions they score (a causal LM's are shifted),
before context parallel has each rank take its slice of the sequences; "dp" above means dp × cp.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from brickwork.components.feedforward.moe import MixtureOfExperts
from brickwork.parallel import ParallelState, PipelinedModel, parallel_state
from brickwork.parallel.compile import apply_compile, is_compiled
from brickwork.train.batch import Batch, check_batch, shard_sequence, share_batch, split_batch
from brickwork.train.fp8 import is_fp8
from brickwork.train.losses import IGNORE_INDEX
from brickwork.train.precision import Precision
from brickwork.train.tasks import Task, TaskFn, get_task

NO_POSITION = "the global batch has no position to learn from (every label is -100)"


class TrainStep:
    """``step = TrainStep(model, optimizer, task); loss = step(batch)``: one optimizer step.

    ``model`` is a plain module or what ``parallelize`` returned; ``optimizer`` is built on its
    ``parameters()``. ``task`` is a name (causal_lm, masked_lm, seq2seq, image_classification) or a
    callable ``(model, batch) -> (loss_sum, count)``. ``batch`` is this data-parallel rank's share, a
    dict with HF's key names (tensor/pipeline-parallel peers may pass None to receive it). Returns
    the mean loss over the whole global batch, identical on every rank. After each call,
    ``metrics`` holds ``skipped`` (an fp16 overflow), ``grad_norm`` (when clipping a step that was
    applied), ``loss_scale`` (fp16), and for MoE models ``aux_loss`` (the weighted load-balancing loss
    added, summed over the MoE layers) and ``expert_counts`` (per MoE layer, summed over dp).
    ``compile=True`` compiles a plain model's layers, head and loss as regions (parallel/compile.py),
    in place; a parallelized model is compiled by ``parallelize(..., compile=True)``, before data
    parallel wraps its layers. ``state_dict()`` is what a checkpoint keeps of the step itself.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        task: str | Task | TaskFn,
        *,
        grad_accum_steps: int = 1,
        precision: str = "fp32",
        grad_clip: float | None = None,
        compile: bool = False,
    ) -> None:
        if (
            isinstance(grad_accum_steps, bool)
            or not isinstance(grad_accum_steps, int)
            or grad_accum_steps < 1
        ):
            raise ValueError(f"grad_accum_steps must be an integer >= 1, got {grad_accum_steps!r}")
        if grad_clip is not None and not (isinstance(grad_clip, int | float) and grad_clip > 0):
            raise ValueError(f"grad_clip must be a positive number or None, got {grad_clip!r}")
        if not isinstance(compile, bool):
            raise TypeError(f"compile must be True or False, got {compile!r}")
        self.model = model
        self.task = get_task(task)
        self.state = parallel_state(model)
        if compile:
            compile_model(model, self.state)
        # Whether the regions run compiled, here or by parallelize: the loop times the first step apart.
        self.compiled = all(is_compiled(m) for m in (self.state.modules if self.state else [model]))
        self.device = model_device(model)
        self.grad_accum_steps = grad_accum_steps
        self.grad_clip = grad_clip
        self.precision = Precision(precision, self.device, self.state)
        if precision == "fp8" and not is_fp8(model):
            raise ValueError(
                "precision='fp8' trains the Float8Linear layers that brickwork.train.fp8.convert_to_fp8 "
                "makes; this model has none: convert it before parallelize"
            )
        self.optimizer = self.state.stepped_optimizer(optimizer) if self.state is not None else optimizer
        self.params = self.state.parameters() if self.state is not None else list(model.parameters())
        self.modules = list(model.modules())
        self.moe = [m for m in self.modules if isinstance(m, MixtureOfExperts)]
        if isinstance(model, PipelinedModel):
            check_pipeline_task(self.task, self.moe)
        self.metrics: dict[str, Any] = {}

    def __call__(self, batch: Batch | None) -> float:
        # Only after an evaluation (or a caller's eval()): train() sets a flag on every module, which
        # costs a small model's CPU step more than checking them.
        if not all(module.training for module in self.modules):
            self.model.train()
        # Aligned before it moves: labels still on the host are counted there, at no wait for the device.
        own = aligned(self.task, check_batch(batch)) if batch is not None else None
        batch = shard_sequence(share_batch(own, self.state, self.device), self.state)
        for param in self.params:
            param.grad = None
        self._divisor, known = self._loss_divisor(batch, own)
        if known is not None and known <= 0:
            raise ValueError(NO_POSITION)
        with loss_context(self.state):
            if isinstance(self.model, PipelinedModel):
                loss_sum, count = self._pipeline_backward(batch)
            else:
                loss_sum, count = self._backward(batch)
        if known is not None:
            # The count was known before the step: the update is queued before the loss is read, so the
            # device never waits for the host between backward and the optimizer.
            self._apply(known)
            return self._global_totals(loss_sum, count)[0] / known
        loss_total, count_total = self._global_totals(loss_sum, count)
        if count_total <= 0:
            raise ValueError(NO_POSITION)
        self._apply(count_total)
        return loss_total / count_total

    def state_dict(self) -> dict[str, Any]:
        """What the step carries from one call to the next, as JSON data for a checkpoint: the fp16
        loss scaler's state (the same on every rank); empty at other precisions."""
        scaler = self.precision.scaler
        return {"loss_scaler": scaler.state_dict()} if scaler is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`. A part this step has no use for (a scaler under another
        precision) is ignored, and a missing one (an older checkpoint) leaves the step as built."""
        scaler = self.precision.scaler
        if scaler is not None and "loss_scaler" in state:
            scaler.load_state_dict(state["loss_scaler"])

    def _global_totals(self, loss_sum: torch.Tensor, count: torch.Tensor) -> tuple[float, float]:
        """(summed loss, scored labels) of the whole global batch, in float64."""
        if self.state is None or (self.state.data_replicas == 1 and not self.state.is_pipeline):
            return float(loss_sum), float(count)  # nothing to sum over ranks: no tensor round trip
        totals = torch.stack([loss_sum.detach().double().reshape(()), count.double().reshape(())])
        totals = _reduce(totals, self.state)
        return float(totals[0]), float(totals[1])

    def _loss_divisor(self, batch: Batch, own: Batch | None) -> tuple[float, float | None]:
        """What backward divides the summed loss by, to keep fp16 gradients in range: the labels per
        data-parallel rank (and sequence slice), averaged over the ranks (the same on all, so DDP's average
        stays exact); the exact mean's factor is applied to the gradients afterwards. Also the global
        batch's scored labels, where they are counted exactly, else None.

        A built-in task's labels are counted as scored (not -100) where that waits for no device: on the
        CPU, or, where this rank's batch is its own (no tensor/pipeline/context-parallel peer shares
        it), in ``own``, the aligned batch as given, before it moved. The divisor is then the exact
        count, so one process divides once, as a plain loop's mean loss does, its gradients need no
        second pass, and the step needs not read the loss before updating. Elsewhere all labels count,
        the same on every peer.
        """
        key = self.task.target_key if isinstance(self.task, Task) else "labels"
        labels = batch.get(key)
        alone = self.state is None or self.state.batch_group is None
        if alone and own is not None and own.get(key) is not None and own[key].device.type == "cpu":
            labels = own[key]
        exact = isinstance(self.task, Task) and labels is not None and labels.device.type == "cpu"
        if labels is None:
            size = next(iter(batch.values())).shape[0]
        elif exact:
            size = int((labels != IGNORE_INDEX).sum())
        else:
            size = labels.numel()
        total = float(size)
        if self.state is not None and self.state.data_replicas > 1:
            summed = torch.tensor([total], dtype=torch.float64, device=self.device)
            dist.all_reduce(summed, group=self.state.dp_group)
            total = float(summed)
        pipelined = self.state is not None and self.state.is_pipeline
        replicas = self.state.data_replicas if self.state is not None else 1
        # No label at all is refused before the step (exact count) or after the forward pass.
        return max(total, 1.0) / replicas, total if exact and not pipelined else None

    def _backward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        sums: list[torch.Tensor] = []
        counts: list[torch.Tensor] = []
        aux_total = torch.zeros((), dtype=torch.float64, device=self.device) if self.moe else None
        micro_batches = split_batch(batch, self.grad_accum_steps)
        expert_counts = [torch.zeros(m.num_experts, dtype=torch.long, device=self.device) for m in self.moe]
        for i, micro in enumerate(micro_batches):
            if self.state is not None:
                self.state.set_gradient_sync(i == len(micro_batches) - 1)
            with self.precision.autocast():
                part, part_count = self.task(self.model, micro)
            part, part_count = _plain(part), torch.as_tensor(_plain(part_count), device=self.device)
            objective = part
            if self.moe:
                aux = sum(m.aux_loss_weight * m.aux_loss for m in self.moe)
                # The aux loss is a mean over the micro-batch; weighted by its count it joins the sum.
                objective = part + aux * part_count
                aux_total += aux.detach().double()
                for total, module in zip(expert_counts, self.moe):
                    total += module.expert_counts
            self.precision.scale(objective.float() / self._divisor).backward()
            sums.append(part.detach().double())
            counts.append(part_count.detach().to(torch.long))
        if self.moe:
            self.metrics["aux_loss"] = float(aux_total) / len(micro_batches)
            self.metrics["expert_counts"] = [
                _reduce(c, self.state, data_parallel_only=True).tolist() for c in expert_counts
            ]
        # Added in micro-batch order, as a running sum would; a list, not running tensors, spares a small
        # model's CPU step the zeros and in-place adds.
        return functools.reduce(operator.add, sums), functools.reduce(operator.add, counts)

    def _pipeline_backward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        model: PipelinedModel = self.model
        task: Task = self.task
        extras = pipeline_extras(task, batch)
        sums: list[torch.Tensor] = []
        counts: list[torch.Tensor] = []

        def loss_fn(output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
            part, part_count = task.loss(output, labels)
            sums.append(part.detach().double())
            counts.append(part_count)
            return self.precision.scale(part.float() / self._divisor)

        microbatches = model.state.config.microbatches * self.grad_accum_steps
        with self.precision.autocast():
            model.run_schedule(
                batch[task.pipeline_input], batch[task.target_key], microbatches, loss_fn, extras
            )
        if not sums:  # not the last stage: the loss is summed over the pipeline afterwards
            zero = torch.zeros((), dtype=torch.float64, device=self.device)
            return zero, zero
        # A schedule's first step on a new shape may call the loss once more on placeholder outputs
        # (shape inference): the real microbatches are the last ones.
        return torch.stack(sums[-microbatches:]).sum(), torch.stack(counts[-microbatches:]).sum()

    def _apply(self, global_count: float) -> None:
        """Finish the gradients, unscale, normalise, clip and step (or skip an fp16 overflow)."""
        if self.state is not None:
            self.state.finish_gradients()
        scaler = self.precision.scaler
        overflowed = scaler.unscale_(self.params) if scaler is not None else False
        self.metrics["skipped"] = overflowed
        self.metrics.pop("grad_norm", None)  # a skipped step has none; an earlier step's is not its own
        if scaler is not None:
            scaler.update(overflowed)
            self.metrics["loss_scale"] = scaler.scale  # the scale of the next step
        if not overflowed:
            dp = self.state.data_replicas if self.state is not None else 1
            # DDP and FSDP average over dp (× cp); the mean is over every scored position of the global batch.
            factor = dp * self._divisor / global_count
            if factor != 1.0:  # 1.0 when the divisor was the exact count: the gradients are already final
                _scale_gradients(self.params, factor)
            norm = None
            if self.grad_clip is not None:
                norm = (
                    self.state.clip_grad_norm(self.grad_clip)
                    if self.state is not None
                    else torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
                )
            self.optimizer.step()
            if norm is not None:  # read once the step is queued: the device never waits for the host
                self.metrics["grad_norm"] = float(norm)
        for param in self.params:
            param.grad = None


def compile_model(model: nn.Module, state: ParallelState | None) -> None:
    """Compile a plain ``model``'s regions in place; a parallelized one must already be compiled."""
    if state is None:
        apply_compile(model)
    elif not all(is_compiled(module) for module in state.modules):
        raise ValueError(
            "compile=True on a model parallelize() laid out without compiling it: pass compile=True to "
            "parallelize instead, which compiles the layers before data parallel wraps them"
        )


@torch.no_grad()
def _scale_gradients(params: list[torch.Tensor], factor: float) -> None:
    """Multiply every gradient by ``factor`` in place: one list-wide call per kind of tensor (plain,
    DTensor), the same products as one ``mul_`` per gradient at a fraction of the host's dispatches."""
    by_kind: dict[type, list[torch.Tensor]] = {}
    for param in params:
        if param.grad is not None:
            by_kind.setdefault(type(param.grad), []).append(param.grad)
    for grads in by_kind.values():
        torch._foreach_mul_(grads, factor)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch | None],
    task: str | Task | TaskFn,
    *,
    precision: str | None = None,
) -> float:
    """The mean loss of ``task`` over ``batches`` (each rank's share, as for TrainStep), without
    updating and without dropout; the same on every rank. ``precision`` (TrainStep's names) computes
    it as training does (``Precision.evaluation``): a bf16 run's validation runs under its autocast, as
    HF's Trainer and nanoGPT evaluate, not in float32 matmuls at a fraction of the speed. None: in
    the model's own dtype, no autocast (an FSDP bf16 policy still computes in bf16)."""
    task = get_task(task)
    state = parallel_state(model)
    device = model_device(model)
    computing = Precision(precision, device, state).evaluation if precision else contextlib.nullcontext
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    if isinstance(model, PipelinedModel):
        check_pipeline_task(task, [])
    try:
        with loss_context(state):
            for batch in batches:
                batch = shard_sequence(aligned(task, share_batch(batch, state, device)), state)
                with computing():
                    if isinstance(model, PipelinedModel):
                        output = model(batch[task.pipeline_input], **pipeline_extras(task, batch))
                        part, count = task.loss(output, batch[task.target_key])
                    else:
                        part, count = task(model, batch)
                part, count = _plain(part), torch.as_tensor(_plain(count), device=device)
                totals += torch.stack([part.detach().double().reshape(()), count.double().reshape(())])
    finally:
        model.train(was_training)
    # A pipelined model's output is already on every rank: only data parallel holds other shares.
    totals = _reduce(totals, state, data_parallel_only=True)
    if totals[1] <= 0:
        raise ValueError("evaluate was given no position to score (no batch, or every label is -100)")
    return float(totals[0] / totals[1])


def aligned(task: Task | TaskFn, batch: Batch) -> Batch:
    """A built-in task's batch with the labels aligned to the positions they score (before context
    parallel splits the sequence); a callable task's batch as given."""
    return task.align(batch) if isinstance(task, Task) else batch


def check_pipeline_task(task: Task | TaskFn, moe: list[MixtureOfExperts]) -> None:
    """The limits of training through pipeline stages, each a clear error naming it."""
    if not isinstance(task, Task) or not task.pipeline_input:
        name = task.name if isinstance(task, Task) else "a callable task"
        raise ValueError(
            f"{name} cannot run under pipeline parallel: the schedule needs the task split into the first "
            "stage's input and a loss on the last stage's output (a built-in task)"
        )
    if any(m.aux_loss_weight > 0 for m in moe):
        raise ValueError(
            "the MoE load-balancing loss (aux_loss_weight > 0) is not supported under pipeline parallel: "
            "it is computed on every stage but the schedule only back-propagates the last stage's loss; "
            "set aux_loss_weight: 0 in the MoE feedforward spec"
        )


def pipeline_extras(task: Task, batch: Batch) -> dict[str, torch.Tensor]:
    """The batch's model inputs besides the first stage's: every stage receives them."""
    return {k: batch[k] for k in task.inputs if k in batch and k != task.pipeline_input}


def model_device(model: nn.Module) -> torch.device:
    """Where the model computes: its layout's device, else its first parameter's."""
    state = parallel_state(model)
    if state is not None:
        return state.device
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def loss_context(state: ParallelState | None) -> contextlib.AbstractContextManager:
    """torch's ``loss_parallel`` whenever tensor parallel is on (losses on vocab-split logits)."""
    if state is not None and state.config.tensor_parallel_size > 1:
        return loss_parallel()
    return contextlib.nullcontext()


def _plain(value: Any) -> Any:
    """A task's loss or count as a plain tensor: a user's task may return loss_parallel's replicated
    DTensor (the local value is the whole one, and autograd flows through ``to_local``)."""
    return value.to_local() if isinstance(value, DTensor) else value


def _reduce(
    values: torch.Tensor, state: ParallelState | None, data_parallel_only: bool = False
) -> torch.Tensor:
    """Sum ``values`` over data (and context) parallel, and, for a step's loss under a pipeline, over
    the stages: only the last one computed it."""
    if state is None:
        return values
    if isinstance(values, DTensor):
        values = values.to_local()
    if state.data_replicas > 1:
        dist.all_reduce(values, group=state.dp_group)
    if state.is_pipeline and not data_parallel_only:
        dist.all_reduce(values, group=state.pp_group)
    return values
