"""The launcher process: the torchrun command planned, the run watched, signals, status.json, the
scaling sweep and the command line (``python -m ddp_engine``)."""
