"""Tensor and sequence parallel: plans as data (plan.py), their checks (checks.py), the DTensor styles
(styles.py), applying them (apply.py), the padded vocabulary (vocab_padding.py), per-part
strategies (parts.py) and Megatron-style layers for hand-written parallel code (layers.py)."""
