"""xformers' block-sparsity configs over ``brickwork.components.attention.block_layouts``.

xformers raised ``NotImplementedError`` for an attention direction other than "bidirectional" /
"unidirectional"; so do these classes. Other bad options raise brickwork's ``ConfigError`` (a
``ValueError``), as xformers' ``ValueError`` s did."""

from __future__ import annotations

from typing import Any

from brickwork.components.attention import block_layouts as bl


class _Directed:
    """Refuses, before the brickwork layout is built, an ``attention`` direction it has no form for."""

    def __init__(self, num_heads: int, **kwargs: Any) -> None:
        attention = kwargs.get("attention", "bidirectional")
        if attention not in bl.DIRECTIONS:
            raise NotImplementedError(
                f'only "uni/bi-directional" attentions are supported, got {attention!r}'
            )
        super().__init__(num_heads, **kwargs)


class SparsityConfig(bl.BlockLayout):
    pass


class DenseSparsityConfig(bl.DenseLayout):
    pass


class FixedSparsityConfig(_Directed, bl.FixedLayout):
    pass


class VariableSparsityConfig(_Directed, bl.VariableLayout):
    pass


class BigBirdSparsityConfig(_Directed, bl.BigBirdLayout):
    pass


class BSLongformerSparsityConfig(_Directed, bl.LongformerLayout):
    pass
