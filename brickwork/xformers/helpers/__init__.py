"""xformers' helpers: hierarchical (MetaFormer-style) configs and test utilities."""
