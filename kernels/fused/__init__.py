"""The Triton ops: kernels, launchers and autograd, one file per op, registered with ``torch.library``.

Importing anything here imports triton; ``brickwork.kernels`` only does so on the first call that
runs a Triton kernel.
"""
