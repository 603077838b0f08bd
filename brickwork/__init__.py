"""brickwork: composable Transformer components, fused kernels, a spec factory and a parallel layer."""

__version__ = "0.1.0"

__all__ = ["__version__"]
