"""xformers' Hydra schema registration: every registered component config as a structured config.

Needs ``hydra-core`` (imported on call, not a brickwork dependency)."""

from __future__ import annotations


def import_xformer_config_schema() -> None:
    """Store each registry's config dataclasses in Hydra's ConfigStore, as ``xformers/<group>/<name>_schema``
    for the groups ``attention``, ``ff`` and ``pe``."""
    from hydra.core.config_store import ConfigStore

    from brickwork.xformers.components.attention import ATTENTION_REGISTRY
    from brickwork.xformers.components.feedforward import FEEDFORWARD_REGISTRY
    from brickwork.xformers.components.positional_embedding import POSITION_EMBEDDING_REGISTRY

    store = ConfigStore.instance()
    for group, registry in (("attention", ATTENTION_REGISTRY), ("ff", FEEDFORWARD_REGISTRY),
                            ("pe", POSITION_EMBEDDING_REGISTRY)):  # fmt: skip
        for name, item in registry.items():
            store.store(name=f"{name}_schema", node=item.config, group=f"xformers/{group}")
