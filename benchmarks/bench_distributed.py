"""torch.distributed on brick vs plain CPU gloo, ratios measured side by side in one run.

Targets (issue 14): all_reduce bandwidth of brick tensors >= 0.95x of CPU tensors over gloo for
1 KiB - 64 MiB; a DDP training step on brick <= 1.1x the same step on the CPU. Both sides run in
one process group ("cpu:gloo,brick:brick": CPU tensors go to plain gloo, brick tensors through
brick's backend to gloo on their aliases), interleaved round by round; medians are printed.

On CUDA backing brick tensors run on NCCL and the baseline is plain cuda tensors on NCCL: one
rank per GPU (NCCL refuses two ranks on one device), so `--nproc 1` on a one-GPU machine.

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

    import torch_brickdev

    def collective_done(_=None):  # NCCL returns at enqueue: the time is to completion
        if on_cuda:
            torch.cuda.synchronize()
            torch.brick.synchronize()

    # On CUDA backing brick tensors go to NCCL: the baseline is then plain cuda tensors on NCCL.
    on_cuda = torch_brickdev.backing_device_type() == "cuda"
    dist.init_process_group("cpu:gloo,cuda:nccl,brick:brick" if on_cuda else "cpu:gloo,brick:brick")
    rank = dist.get_rank()
    torch.brick.set_device(rank % torch.brick.device_count())
    brick = torch.device("brick", rank % torch.brick.device_count())
    plain = torch.device("cuda", rank % torch.cuda.device_count()) if on_cuda else torch.device("cpu")
    if on_cuda:
        torch.cuda.set_device(plain)
    engine = "nccl" if on_cuda else "gloo"
    rows = []
    for nbytes in SIZES:
        tensors = {"plain": torch.ones(nbytes // 4, device=plain),
                   "brick": torch.ones(nbytes // 4, device=brick)}
        repeats = max(2, min(200, (8 << 20) // nbytes))
        samples = {"plain": [], "brick": []}
        for t in tensors.values():  # warm-up (connections, buffers)
            dist.all_reduce(t)
        for _ in range(rounds):
            for key, t in tensors.items():
                dist.barrier()
                samples[key].append(time_per_call(lambda t=t: collective_done(dist.all_reduce(t)),
                                                  repeats))
        rows.append((nbytes, statistics.median(samples["plain"]),
                     statistics.median(samples["brick"])))

    # Brick's own cost per collective, without a peer to wait for: a 1 KiB all_reduce on a
    # one-rank group (the same backends), brick tensor vs CPU tensor.
    solo = [dist.new_group([r]) for r in range(dist.get_world_size())][rank]
    solo_tensors = {"plain": torch.ones(256, device=plain), "brick": torch.ones(256, device=brick)}
    solo_samples = {"plain": [], "brick": []}
    for key, t in solo_tensors.items():
        time_per_call(lambda t=t: dist.all_reduce(t, group=solo), 200)
    for _ in range(rounds):
        for key, t in solo_tensors.items():
            solo_samples[key].append(time_per_call(lambda t=t: dist.all_reduce(t, group=solo), 2000))
            collective_done()

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

    steps = {"plain": ddp_step(plain), "brick": ddp_step(brick)}
    for s in steps.values():
        s()
    ddp_samples = {"plain": [], "brick": []}
    for _ in range(rounds):
        for key, s in steps.items():
            dist.barrier()
            ddp_samples[key].append(time_per_call(lambda s=s: collective_done(s()), 5))
    if rank == 0:
        world = dist.get_world_size()
        base = plain.type
        print(f"all_reduce, {world} rank(s), {engine}; brick tensors vs {base} tensors; median of "
              f"{rounds} interleaved rounds")
        print(f"{'bytes':>10} {base + ' us':>10} {'brick us':>10} {base + ' GB/s':>9} "
              f"{'brick GB/s':>10} {'brick/' + base + ' bw':>12}  (target >= 0.95)")
        for nbytes, base_ns, brick_ns in rows:
            print(f"{nbytes:>10} {base_ns / 1e3:>10.1f} {brick_ns / 1e3:>10.1f} "
                  f"{nbytes / base_ns:>9.3f} {nbytes / brick_ns:>10.3f} {base_ns / brick_ns:>12.3f}")
        base_ns, brk = (statistics.median(solo_samples[k]) for k in ("plain", "brick"))
        print(f"brick's cost per collective (1 KiB all_reduce on a one-rank group): {base} "
              f"{base_ns / 1e3:.1f} us, brick {brk / 1e3:.1f} us, brick - {base} "
              f"{(brk - base_ns) / 1e3:.1f} us")
        base_ns, brk = (statistics.median(ddp_samples[k]) for k in ("plain", "brick"))
        print(f"DDP step (MLP 256-1024-1024-256, batch 64): {base} {base_ns / 1e3:.1f} us, brick "
              f"{brk / 1e3:.1f} us, brick/{base} {brk / base_ns:.3f}x (target <= 1.1)")
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
