"""The error xformers raised as an ``AssertionError``, raised here explicitly (it survives ``python -O``).

It derives from both ``ValueError`` (brickwork's convention for bad input) and ``AssertionError``
(what xformers callers catch), so code written for either keeps working.
"""

from __future__ import annotations


class XformersCompatError(ValueError, AssertionError):
    """A call xformers refused with an assertion."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`XformersCompatError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise XformersCompatError(message)


def as_int(value: object) -> object:
    """An integral float (xformers configs often carry ``dim_model / num_heads``) as an int."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
