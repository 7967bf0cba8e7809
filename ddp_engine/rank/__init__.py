"""Inside each rank (torch): the worker, the training loop, distributed set-up and the agreed stop,
sync timing, device sampling, the telemetry server, data, models, losses, checkpoints, plugins."""
