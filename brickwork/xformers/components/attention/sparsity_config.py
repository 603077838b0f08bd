"""xformers' block-sparsity configs over ``brickwork.components.attention.block_layouts``.

xformers raised ``NotImplementedError`` for an attention direction other than "bidirectional" /
"unidirectional"; so do these classes. Other bad options raise brickwork's ``ConfigError`` (a
``ValueError``), as xformers' ``ValueError`` s did."""

from __future__ import annotations

from typing import Any

from brickwork.components.attention import block_layouts as bl


def _direction(kwargs: dict[str, Any]) -> None:
    attention = kwargs.get("attention", "bidirectional")
    if attention not in bl.DIRECTIONS:
        raise NotImplementedError(f'only "uni/bi-directional" attentions are supported, got {attention!r}')


class SparsityConfig(bl.BlockLayout):
    pass


class DenseSparsityConfig(bl.DenseLayout):
    pass


class FixedSparsityConfig(bl.FixedLayout):
    def __init__(self, num_heads: int, **kwargs: Any) -> None:
        _direction(kwargs)
        super().__init__(num_heads, **kwargs)


class VariableSparsityConfig(bl.VariableLayout):
    def __init__(self, num_heads: int, **kwargs: Any) -> None:
        _direction(kwargs)
        super().__init__(num_heads, **kwargs)


class BigBirdSparsityConfig(bl.BigBirdLayout):
    def __init__(self, num_heads: int, **kwargs: Any) -> None:
        _direction(kwargs)
        super().__init__(num_heads, **kwargs)


class BSLongformerSparsityConfig(bl.LongformerLayout):
    def __init__(self, num_heads: int, **kwargs: Any) -> None:
        _direction(kwargs)
        super().__init__(num_heads, **kwargs)
