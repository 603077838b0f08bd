"""The ways into one Triton op, built once for every op: a direct launch, an eager autograd.Function,
and the ``torch.library`` ops that ``torch.compile`` traces.

An op file writes its launchers, ``<op>_forward(*inputs, wrap=direct)`` and ``<op>_backward(...,
wrap=direct)``, plus two small functions in the form ``register_autograd`` takes:
``setup_context(ctx, inputs, output)`` saves what the backward needs, and
``gradients(ctx, dy, backward)`` turns ``dy`` into one gradient per input, launching through
``backward`` (the backward launcher in eager mode, its library op while compiling). A forward launcher
returns the result, or a tuple whose first item is the result and whose others are only kept for the
backward (row statistics). :class:`TritonOp` picks the way in per call:

- ``torch.compiler.is_compiling()``: the ``triton_op`` ``brickwork::<name>_fwd`` (its autograd is
  ``brickwork::<name>_bwd``), which runs the launchers with ``wrap=wrap_triton`` so that Dynamo and
  Inductor see the kernels;
- eager, with an input that autograd records: a plain ``torch.autograd.Function`` whose forward and
  backward call the launchers, which launch the kernels directly (no dispatcher, no tracing layer);
- eager, with nothing to differentiate: the forward launcher alone.
"""

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.library import triton_op, wrap_triton

from .launch import needs_autograd

SetupContext = Callable[[Any, tuple, Any], None]
Gradients = Callable[[Any, torch.Tensor, Callable], tuple]


def _result(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _library_op(name: str, launcher: Callable) -> Callable:
    """``launcher`` with ``wrap=wrap_triton``, registered as the triton_op ``brickwork::<name>``.

    The schema is the launcher's signature without ``wrap`` and without defaults (every call passes
    every argument).
    """
    signature = inspect.signature(launcher, eval_str=True)
    parameters = [p.replace(default=p.empty) for p in signature.parameters.values() if p.name != "wrap"]

    def launch(*args: Any) -> Any:
        return launcher(*args, wrap=wrap_triton)

    launch.__signature__ = signature.replace(parameters=parameters)
    launch.__name__ = launch.__qualname__ = name
    launch.__module__ = launcher.__module__
    return triton_op(f"brickwork::{name}", launch, mutates_args=())


def _eager_function(op: "TritonOp") -> type[torch.autograd.Function]:
    """The eager autograd path of ``op``: a plain ``autograd.Function`` calling its launchers."""

    class EagerFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: Any) -> torch.Tensor:
            output = op.forward(*inputs)
            op.setup_context(ctx, inputs, output)
            return _result(output)

        @staticmethod
        def backward(ctx: Any, dy: torch.Tensor) -> tuple:
            return op.gradients(ctx, dy, op.backward)

    return EagerFunction


class TritonOp:
    """One Triton op's three ways in (see the module docstring). ``op(*inputs)`` -> the result.

    ``forward`` and ``backward`` are the launchers; ``setup_context`` and ``gradients`` the autograd
    wiring.
    """

    def __init__(
        self,
        name: str,
        forward: Callable,
        backward: Callable,
        setup_context: SetupContext,
        gradients: Gradients,
    ) -> None:
        self.forward, self.backward = forward, backward
        self.setup_context, self.gradients = setup_context, gradients
        self.library_op = _library_op(f"{name}_fwd", forward)
        backward_op = _library_op(f"{name}_bwd", backward)
        self.library_op.register_autograd(
            lambda ctx, dy, *_: gradients(ctx, dy, backward_op), setup_context=setup_context
        )
        self.eager_function = _eager_function(self)

    def __call__(self, *inputs: Any) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return _result(self.library_op(*inputs))
        if needs_autograd(*inputs):
            return self.eager_function.apply(*inputs)
        return _result(self.forward(*inputs))
