"""The one exception type for invalid specs and options, shared by components and the factory."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping


class ConfigError(ValueError):
    """An invalid spec or component option.

    The message starts with the dotted key path (e.g. ``decoder.block.attention.name``) when one is
    known, says what was wrong, lists the allowed choices where there is a finite set, and names the
    closest choice to the value given.
    """

    def __init__(
        self,
        message: str,
        path: str | None = None,
        choices: Iterable[str] | None = None,
        got: object | None = None,
        related: Iterable[str] = (),
    ) -> None:
        self.path = path or ""
        self.reason = message
        self.choices = sorted(str(c) for c in choices) if choices is not None else None
        self.got = got
        # The other options a rule spanning several of them reads, named at their own key paths.
        self.related = tuple(related)
        text = f"{self.path}: {message}" if self.path else message
        if self.related:
            text += f" (with {', '.join(self.related)})"
        if self.choices is not None:
            text += f"; allowed: {', '.join(self.choices) or '(none)'}"
            if got is not None:
                close = difflib.get_close_matches(str(got), self.choices, n=1, cutoff=0.5)
                if close:
                    text += f"; did you mean {close[0]!r}?"
        super().__init__(text)

    def at(self, prefix: str, sources: Mapping[str, str] | None = None) -> ConfigError:
        """The same error with ``prefix`` put in front of its key paths, or, for a key in ``sources``
        (an argument the factory passes), the spec key that set it."""

        def place(key: str) -> str:
            return sources[key] if sources and key in sources else join_path(prefix, key)

        return ConfigError(self.reason, place(self.path), self.choices, self.got, map(place, self.related))


def join_path(*parts: str | int | None) -> str:
    """``join_path("decoder", "block", None, "name") == "decoder.block.name"``."""
    return ".".join(str(p) for p in parts if p is not None and p != "")


class RunFailure(RuntimeError):
    """A run stopped for a reason outside its spec, which the message names with what to do: a disk
    that filled while saving, a peer process that stopped or never came. ``brickwork`` reports it in
    one line, as it does a ConfigError."""
