"""Data parallel and ZeRO: DDP attached to the model (ddp.py), ZeRO-1's optimizer (zero.py), FSDP2
for ZeRO-2/3 (fsdp.py), chosen by ``zero_stage`` in apply.py."""
