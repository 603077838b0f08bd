"""Single-process training steps: forward, loss, backward, clipping, optimizer step, on one device."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when a GPU is usable, else CPU; ``cuda`` without a GPU is a clear error."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device=cuda, but no CUDA device is usable here; use train.device=cpu")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy. logits [B, T, V], labels [B, T] -> scalar (computed in fp32)."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


class LocalEngine:
    """Runs the model on one device; the parallel engine offers the same methods under torchrun."""

    is_main = True

    def __init__(
        self, model: torch.nn.Module, device: torch.device, precision: str, grad_clip: float
    ) -> None:
        self.model = model.to(device)
        self.device = device
        self.grad_clip = grad_clip
        self.dtype = torch.bfloat16 if precision == "bf16" else None
        if device.type == "cpu":
            # Subnormal floats (tiny gradients, Adam's second moments) take a slow microcode path
            # on x86 CPUs; flushing them to zero makes CPU steps many times faster at no cost in loss.
            torch.set_flush_denormal(True)

    @property
    def checkpoint_model(self) -> torch.nn.Module:
        """What a checkpoint saves and loads: the model itself."""
        return self.model

    def describe(self) -> str:
        return f"1 process, {self.device.type}" + (", bf16 autocast" if self.dtype is not None else "")

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def train_step(
        self, input_ids: torch.Tensor, labels: torch.Tensor, optimizer: torch.optim.Optimizer
    ) -> float:
        """One optimizer step on [B, T] ids and labels; returns the mean token loss."""
        self.model.train()
        with self._autocast():
            logits = self.model(input_ids.to(self.device))
        loss = lm_loss(logits, labels.to(self.device))
        loss.backward()
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    @torch.no_grad()
    def evaluate(self, input_ids: torch.Tensor, labels: torch.Tensor, batch_size: int) -> float:
        """Mean token loss over [N, T] windows, in batches of ``batch_size``, without dropout."""
        self.model.eval()
        total, count = 0.0, 0
        for start in range(0, input_ids.shape[0], batch_size):
            x = input_ids[start : start + batch_size].to(self.device)
            y = labels[start : start + batch_size].to(self.device)
            with self._autocast():
                logits = self.model(x)
            total += lm_loss(logits, y).item() * y.numel()
            count += y.numel()
        return total / count

    def sample_model(self) -> torch.nn.Module:
        """The model to generate text from (this process holds all of it)."""
        return self.model

    def close(self) -> None:
        """Nothing to release in a single process."""
