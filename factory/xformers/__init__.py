"""xformers' factory configs (``xFormerConfig``-style dicts), read in one place.

``stack.py`` reads one stack config under xformers' keys, names and defaults (``read_stack``, for
``brickwork.xformers``' config classes too) and translates it to brickwork's block spec;
``model.py`` turns the stacks into a model spec (``from_xformers_config``).
"""

from brickwork.factory.xformers.model import from_xformers_config

__all__ = ["from_xformers_config"]
