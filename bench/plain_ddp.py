"""The standard DDP recipe and nothing else, for bench/telemetry_overhead.py.

Run under torchrun. Same model and data builders as the engine, its own plain loop: no comm
hook, no timing, no device sampling, no telemetry, no stop checks, no metrics file. Rank 0
prints {"samples_per_s": X, "cpu_s_per_ksample": Y} over steps [warmup, steps) (Y: every rank's
process CPU seconds per 1,000 samples). With --first-step-file PATH, rank 0 also
writes time.time() to PATH after its first optimizer step (for bench/launch_latency.py).
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ddp_engine.common.config import RunConfig
from ddp_engine.common.config_files import load_config_file
from ddp_engine.rank.data import build_datasets
from ddp_engine.rank.models import build_model
from ddp_engine.rank.trainer import build_optimizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--first-step-file", help="rank 0 writes time.time() here after step 1")
    args = parser.parse_args()
    cfg = RunConfig.from_dict(load_config_file(args.config))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(cfg.seed)
    data = build_datasets(cfg)
    model = DDP(build_model(cfg, data.info))
    opt = build_optimizer(cfg, model.parameters())  # the engine's, from the same config
    sampler = DistributedSampler(data.train, num_replicas=world, rank=rank, seed=cfg.seed,
                                 drop_last=True)
    loader = DataLoader(data.train, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)
    assert cfg.max_steps is not None
    step, epoch, t0, cpu0 = 0, 0, 0.0, 0.0
    while step < cfg.max_steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            if step == args.warmup:
                t0 = time.perf_counter()
                cpu0 = time.process_time()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == 1 and rank == 0 and args.first_step_file:
                with open(args.first_step_file, "w") as f:
                    f.write(repr(time.time()))
            if step >= cfg.max_steps:
                break
        epoch += 1
    elapsed = time.perf_counter() - t0
    cpu = torch.tensor([time.process_time() - cpu0], dtype=torch.float64)
    dist.all_reduce(cpu)  # every rank's CPU seconds over the measured steps
    if rank == 0:
        samples = (cfg.max_steps - args.warmup) * cfg.batch_size * world
        print(json.dumps({"samples_per_s": samples / elapsed,
                          "cpu_s_per_ksample": 1000 * float(cpu[0]) / samples}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
