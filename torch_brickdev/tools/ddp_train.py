"""One rank of ``python -m torch_brickdev train --nproc N`` (run by torchrun): the training demo
under DistributedDataParallel on this rank's brick device and, in the same process group, on the
CPU (plain gloo), step for step; then a few more brick steps under the brick profiler, whose
report this rank writes to ``<output>/rank<N>/report.json``.

Rank 0 prints the losses and step times of both; every rank checks that brick's losses and
parameters equal the CPU run's (exit code 1 where they do not)."""

import argparse
import copy
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import torch_brickdev.profiler as bp
from torch_brickdev.tools._args import positive_int
from torch_brickdev.tools.training import residual_mlp, steady_ratio, train_steps


def _largest_difference(a, b) -> float:
    return max((x.detach().cpu() - y.detach()).abs().max().item() for x, y in zip(a, b))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="torch_brickdev.tools.ddp_train")
    parser.add_argument("--width", type=positive_int, default=256)
    parser.add_argument("--depth", type=positive_int, default=4)
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--profiled-steps", type=positive_int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=positive_int, default=120,
                        help="seconds a collective may wait for the other ranks")
    parser.add_argument("--output", "-o", required=True)
    args = parser.parse_args(argv)

    dist.init_process_group("cpu:gloo,brick:brick",
                            timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("brick", local_rank % torch.brick.device_count())
    torch.brick.set_device(device)

    torch.manual_seed(args.seed)  # the same initial model on every rank and device
    cpu_model = residual_mlp(args.width, args.depth, 10)
    brick_model = copy.deepcopy(cpu_model).to(device)
    shard = torch.Generator().manual_seed(args.seed + 1000 + rank)  # each rank its own data
    data = torch.randn(args.batch, args.width, generator=shard)
    targets = torch.randint(0, 10, (args.batch,), generator=shard)
    brick_ddp = DistributedDataParallel(brick_model)
    cpu_ddp = DistributedDataParallel(cpu_model)

    brick_losses, brick_times = train_steps(brick_ddp, data.to(device), targets.to(device),
                                            args.steps)
    cpu_losses, cpu_times = train_steps(cpu_ddp, data, targets, args.steps)
    differences = torch.tensor([max(abs(a - b) for a, b in zip(brick_losses, cpu_losses)),
                                _largest_difference(brick_model.parameters(), cpu_model.parameters())],
                               dtype=torch.float64)
    dist.all_reduce(differences, op=dist.ReduceOp.MAX)  # the worst of every rank
    ratio = torch.tensor([steady_ratio(brick_times, cpu_times)], dtype=torch.float64)
    ratios = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(ratios, ratio)

    with bp.profile(metadata={"command": "train", "steps": args.profiled_steps}) as profiled:
        train_steps(brick_ddp, data.to(device), targets.to(device), args.profiled_steps,
                    step_range="TrainStep")
    folder = os.path.join(args.output, f"rank{rank}")
    os.makedirs(folder, exist_ok=True)
    profiled.report.write_json(os.path.join(folder, "report.json"))

    if rank == 0:
        params = sum(p.numel() for p in cpu_model.parameters())
        print(f"DistributedDataParallel, {world} ranks: each on its brick device and on the CPU "
              f"(gloo), in one process group; {args.depth} residual MLP blocks, width "
              f"{args.width}, {params:,} parameters, batch {args.batch} per rank")
        print(f"\nrank 0\n{'step':>4}  {'loss (brick)':>12}  {'loss (cpu)':>12}  "
              f"{'ms (brick)':>10}  {'ms (cpu)':>9}")
        for step, row in enumerate(zip(brick_losses, cpu_losses, brick_times, cpu_times)):
            lb, lc, tb, tc = row
            print(f"{step:>4}  {lb:>12.6f}  {lc:>12.6f}  {tb * 1e3:>10.2f}  {tc * 1e3:>9.2f}")
        print(f"\nlargest difference brick vs cpu over all ranks: loss {differences[0]:.2e}, "
              f"parameters {differences[1]:.2e}")
        print("step time brick / cpu (after the first step), per rank: "
              + ", ".join(f"{r.item():.3f}x" for r in ratios))
    dist.destroy_process_group()
    if differences.max().item() > 1e-5:
        print(f"error: rank {rank}: brick and cpu diverged", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
