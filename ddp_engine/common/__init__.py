"""The engine's shared part: torch-free, the only part the app imports (config, run folder, runs,
protocol, heartbeats, GPUs through NVML, processes, cluster scripts, sweep plans)."""
