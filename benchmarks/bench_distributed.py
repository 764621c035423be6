"""torch.distributed on brick vs plain CPU gloo, ratios measured side by side in one run.

Targets (issue 14): all_reduce bandwidth of brick tensors >= 0.95x of CPU tensors over gloo for
1 KiB - 64 MiB; a DDP training step on brick <= 1.1x the same step on the CPU. Both sides run in
one process group ("cpu:gloo,brick:brick": CPU tensors go to plain gloo, brick tensors through
brick's backend to gloo on their aliases), interleaved round by round; medians are printed.

Run: python benchmarks/bench_distributed.py [--nproc 2] [--rounds N]
(it launches itself under torchrun; rank 0 prints the table)
"""

import argparse
import os
import statistics
import subprocess
import sys

from bench_ops import time_per_call

SIZES = [1 << 10, 1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24, 1 << 26]


def worker(rounds: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import torch_brickdev  # noqa: F401

    dist.init_process_group("cpu:gloo,brick:brick")
    rank = dist.get_rank()
    torch.brick.set_device(rank % torch.brick.device_count())
    brick = torch.device("brick", rank % torch.brick.device_count())
    rows = []
    for nbytes in SIZES:
        tensors = {d: torch.ones(nbytes // 4, device=d) for d in ("cpu", brick)}
        repeats = max(2, min(200, (8 << 20) // nbytes))
        samples = {"cpu": [], "brick": []}
        for d, t in tensors.items():  # warm-up (connections, buffers)
            dist.all_reduce(t)
        for _ in range(rounds):
            for key, d in (("cpu", "cpu"), ("brick", brick)):
                dist.barrier()
                samples[key].append(time_per_call(lambda: dist.all_reduce(tensors[d]), repeats))
        rows.append((nbytes, statistics.median(samples["cpu"]), statistics.median(samples["brick"])))

    # Brick's own cost per collective, without a peer to wait for: a 1 KiB all_reduce on a
    # one-rank group (the same backends), brick tensor vs CPU tensor.
    solo = [dist.new_group([r]) for r in range(dist.get_world_size())][rank]
    solo_tensors = {"cpu": torch.ones(256), "brick": torch.ones(256, device=brick)}
    solo_samples = {"cpu": [], "brick": []}
    for key, t in solo_tensors.items():
        time_per_call(lambda t=t: dist.all_reduce(t, group=solo), 200)
    for _ in range(rounds):
        for key, t in solo_tensors.items():
            solo_samples[key].append(time_per_call(lambda t=t: dist.all_reduce(t, group=solo), 2000))

    def ddp_step(device):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                              nn.Linear(1024, 256)).to(device)
        ddp = DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x, y = torch.randn(64, 256).to(device), torch.randn(64, 256).to(device)

        def step():
            loss = ((ddp(x) - y) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        return step

    steps = {"cpu": ddp_step(torch.device("cpu")), "brick": ddp_step(brick)}
    for s in steps.values():
        s()
    ddp_samples = {"cpu": [], "brick": []}
    for _ in range(rounds):
        for key, s in steps.items():
            dist.barrier()
            ddp_samples[key].append(time_per_call(s, 5))
    if rank == 0:
        world = dist.get_world_size()
        print(f"all_reduce, {world} ranks on loopback, gloo; median of {rounds} interleaved rounds")
        print(f"{'bytes':>10} {'cpu us':>10} {'brick us':>10} {'cpu GB/s':>9} {'brick GB/s':>10} "
              f"{'brick/cpu bw':>12}  (target >= 0.95)")
        for nbytes, cpu_ns, brick_ns in rows:
            print(f"{nbytes:>10} {cpu_ns / 1e3:>10.1f} {brick_ns / 1e3:>10.1f} {nbytes / cpu_ns:>9.3f} "
                  f"{nbytes / brick_ns:>10.3f} {cpu_ns / brick_ns:>12.3f}")
        cpu, brk = statistics.median(solo_samples["cpu"]), statistics.median(solo_samples["brick"])
        print(f"brick's cost per collective (1 KiB all_reduce on a one-rank group): cpu "
              f"{cpu / 1e3:.1f} us, brick {brk / 1e3:.1f} us, brick - cpu {(brk - cpu) / 1e3:.1f} us")
        cpu, brk = statistics.median(ddp_samples["cpu"]), statistics.median(ddp_samples["brick"])
        print(f"DDP step (MLP 256-1024-1024-256, batch 64): cpu {cpu / 1e3:.1f} us, brick "
              f"{brk / 1e3:.1f} us, brick/cpu {brk / cpu:.3f}x (target <= 1.1)")
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args.rounds)
        return 0
    return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", str(args.nproc), os.path.abspath(__file__),
                            "--rounds", str(args.rounds)], timeout=1200)


if __name__ == "__main__":
    sys.exit(main())
