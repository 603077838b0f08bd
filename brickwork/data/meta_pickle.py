"""Reading a nanoGPT ``meta.pkl`` without running code from it.

nanoGPT's data preparation scripts pickle a plain dict (``vocab_size``, and for character-level data
``stoi`` / ``itos``). A pickle can name any importable callable and have it called while loading, so
this unpickler resolves no name at all: the opcodes for dicts, lists, tuples, strings, numbers,
booleans and None need none, and every ``GLOBAL`` / ``STACK_GLOBAL`` stops the load with an error
naming the file and what it tried to import, before anything is called.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from brickwork.errors import ConfigError

PLAIN = (dict, list, tuple, str, int, float, bool, type(None))


class UnsafePickleError(ConfigError):
    """A pickle that asks for anything but plain data."""


class _PlainUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, source: Path) -> None:
        super().__init__(io.BytesIO(data))
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(
            f"{str(self.source)!r} asks to load {module}.{name}; a meta.pkl may hold only plain dicts, "
            "lists, strings and numbers, and this one is refused unread",
            "data.path",
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(f"{str(self.source)!r} holds a persistent reference; refused", "data.path")


def load_plain_pickle(path: Path) -> Any:
    """The plain data (nested dicts, lists, tuples, strings, numbers) pickled in ``path``."""
    try:
        value = _PlainUnpickler(path.read_bytes(), path).load()
    except UnsafePickleError:
        raise
    except Exception as err:  # a damaged pickle fails in many ways; each is the file's fault
        raise ConfigError(f"{str(path)!r} is not a readable pickle: {err}", "data.path") from None
    _check_plain(value, path)
    return value


def _check_plain(value: Any, path: Path) -> None:
    # Sets, bytes and the like need no import either; they are still not what a meta.pkl holds.
    if not isinstance(value, PLAIN):
        raise UnsafePickleError(
            f"{str(path)!r} holds a {type(value).__name__}; a meta.pkl may hold only plain dicts, lists, "
            "strings and numbers",
            "data.path",
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(key, path)
            _check_plain(item, path)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_plain(item, path)
