"""DistributedDataParallel on brick, one brick device per rank; run it with torchrun:

    torchrun --nproc-per-node 2 examples/ddp_train.py [--device cpu] [--steps N]
    torchrun --nproc-per-node 2 -m torch_brickdev profile -o out examples/ddp_train.py
    python -m torch_brickdev merge out/rank*/report.json

Each rank trains the same MLP on its own shard of a synthetic regression task; DDP averages the
gradients with all_reduce on brick memory (brick's c10d backend; gloo on the host runtime).
Rank 0 prints the loss per step and a checksum of the parameters, which equal the same run with
``--device cpu`` (plain gloo) step for step.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import torch_brickdev  # noqa: F401  (registers brick and its c10d backend)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=["brick", "cpu"], default="brick")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()

    dist.init_process_group("cpu:gloo,brick:brick")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "brick":
        local = rank % torch.brick.device_count()
        torch.brick.set_device(local)
        device = torch.device("brick", local)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)  # the same initial model on every rank and device
    model = nn.Sequential(nn.Linear(64, args.width), nn.GELU(), nn.Linear(args.width, args.width),
                          nn.GELU(), nn.Linear(args.width, 1)).to(device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    for step in range(args.steps):
        with torch.profiler.record_function("TrainStep"):
            x = torch.randn(128, 64, generator=data).to(device)
            y = x[:, :1].sin().to(device)
            loss = nn.functional.mse_loss(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"step {step}: loss {loss.item():.6f}")
    checksum = sum(p.double().sum().item() for p in model.parameters())
    if rank == 0:
        print(f"world {world}, device {args.device}: parameter checksum {checksum:.9f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
