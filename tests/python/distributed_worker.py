"""One rank of test_distributed.py's runs (launched by torchrun). ``argv[1]`` names the scenario,
``argv[2]`` the folder each rank writes its ``rank<N>.json`` results to."""

import datetime
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn

import torch_brickdev  # noqa: F401

SCENARIO, OUT = sys.argv[1], sys.argv[2]
RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
TIMEOUT = datetime.timedelta(seconds=30)  # a hang becomes an error naming the rank and op
results = {}


def error_of(fn):
    """``fn()``'s exception as "Type: message" ("no error" when it raises none)."""
    try:
        fn()
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}"[:500]
    return "no error"


def on_both(fn, baseline=torch.device("cpu")):
    """fn(device) on brick (this rank's device) and on `baseline`: both as lists, by device type."""
    out = {}
    for device in (torch.device("brick", RANK % torch.brick.device_count()), baseline):
        value = fn(device)
        values = value if isinstance(value, (list, tuple)) else [value]
        assert all(v.device == device for v in values), [v.device for v in values]
        out[device.type] = [v.cpu().tolist() for v in values]
    return out


def common_collectives(base, numel, run_on_both, broadcast_src):
    """The collectives both engines' scenarios check, each run by ``run_on_both`` on brick and its
    baseline: an async all_reduce (its future answers with the caller's tensor), a broadcast, an
    all_gather_into_tensor and a reduce_scatter_tensor of ``base(device)`` (``numel`` elements)."""
    def all_reduce_async(d):
        t = base(d)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        value = work.get_future().wait()[0]
        assert value.device == d and value.data_ptr() == t.data_ptr()
        return t

    def broadcast(d):
        t = base(d)
        dist.broadcast(t, src=broadcast_src)
        return t

    def all_gather_into_tensor(d):
        out = torch.empty(numel * WORLD, device=d)
        dist.all_gather_into_tensor(out, base(d))
        return out

    def reduce_scatter_tensor(d):
        out = torch.empty(numel, device=d)
        dist.reduce_scatter_tensor(out, base(d).repeat(WORLD))
        return out

    return {name: run_on_both(fn) for name, fn in (
        ("all_reduce_async", all_reduce_async), ("broadcast", broadcast),
        ("all_gather_into_tensor", all_gather_into_tensor),
        ("reduce_scatter_tensor", reduce_scatter_tensor))}


def collectives():
    dist.init_process_group("cpu:gloo,brick:brick", timeout=TIMEOUT)
    torch.brick.set_device(RANK % torch.brick.device_count())
    base = lambda d, dtype=torch.float32: (torch.arange(6, dtype=dtype) + 1 + RANK * 10).to(d)  # noqa: E731
    for op in ("SUM", "PRODUCT", "MIN", "MAX"):
        def all_reduce(d, op=op):
            t = base(d)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            return t
        results[f"all_reduce_{op}"] = on_both(all_reduce)
    for op in ("BAND", "BOR", "BXOR"):
        def bitwise(d, op=op):
            t = base(d, torch.int64)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            return t
        results[f"all_reduce_{op}"] = on_both(bitwise)

    results.update(common_collectives(base, 6, on_both, broadcast_src=1))

    def reduce(d):
        t = base(d)
        dist.reduce(t, dst=0)
        return t
    results["reduce"] = on_both(reduce)

    def all_gather(d):
        outs = [torch.empty(6, device=d) for _ in range(WORLD)]
        dist.all_gather(outs, base(d))
        return outs
    results["all_gather"] = on_both(all_gather)

    def gather(d):
        outs = [torch.empty(6, device=d) for _ in range(WORLD)] if RANK == 0 else None
        dist.gather(base(d), outs, dst=0)
        return outs if RANK == 0 else base(d)
    results["gather"] = on_both(gather)

    def scatter(d):
        out = torch.empty(3, device=d)
        chunks = [torch.full((3,), float(i), device=d) for i in range(WORLD)] if RANK == 0 else None
        dist.scatter(out, chunks, src=0)
        return out
    results["scatter"] = on_both(scatter)

    def all_to_all_single(d):
        out = torch.empty(2 * WORLD, device=d)
        dist.all_to_all_single(out, (torch.arange(2 * WORLD) + 100 * RANK).float().to(d))
        return out
    results["all_to_all_single"] = on_both(all_to_all_single)

    def all_to_all(d):
        outs = [torch.empty(2, device=d) for _ in range(WORLD)]
        dist.all_to_all(outs, [torch.full((2,), float(RANK * 10 + i), device=d) for i in range(WORLD)])
        return outs
    if dist.get_backend(None) is not None:
        try:
            results["all_to_all"] = on_both(all_to_all)
        except RuntimeError as error:  # gloo has no list all_to_all on the CPU either
            results["all_to_all"] = {"error": str(error)[:200]}

    def send_recv(d):
        t = base(d)
        if RANK == 0:
            dist.send(t, dst=1)
        elif RANK == 1:
            dist.recv(t, src=0)
        return t
    results["send_recv"] = on_both(send_recv)

    def coalesced(d):
        tensors = [base(d), base(d) * 2]
        with dist._coalescing_manager(async_ops=True) as manager:
            for t in tensors:
                dist.all_reduce(t)
        manager.wait()
        return tensors
    results["coalesced_all_reduce"] = on_both(coalesced)

    # PREMUL_SUM (gloo has none: brick scales, gloo sums) and AVG, as FSDP2 asks for them; the
    # CPU's gloo refuses PREMUL_SUM, so brick's results are checked against the arithmetic.
    brick = torch.device("brick", RANK % torch.brick.device_count())
    both_ranks = (torch.arange(6.0) + 1) * 2 + 10  # base() summed over the two ranks
    reduced = {}
    for name, op, factor in (("avg", dist.ReduceOp.AVG, 0.5),
                             ("premul", dist.ReduceOp.PREMUL_SUM(0.25), 0.25),
                             ("premul_tensor", dist.ReduceOp.PREMUL_SUM(torch.tensor(3.0, device=brick)), 3.0)):
        t = base(brick)
        dist.all_reduce(t, op=op)
        source = base(brick)
        out = torch.empty(6 // WORLD, device=brick)
        dist.reduce_scatter_tensor(out, source, op=op)
        shard = both_ranks[RANK * 3:(RANK + 1) * 3]
        reduced[name] = {"all_reduce": t.cpu().tolist(), "expected": (both_ranks * factor).tolist(),
                         "reduce_scatter": out.cpu().tolist(), "expected_shard": (shard * factor).tolist(),
                         "input_kept": torch.equal(source.cpu(), base("cpu"))}
    results["reduce_ops"] = reduced

    results["held"] = tensors_held_until_done(brick)
    dist.barrier()
    results["counters"] = torch_brickdev.distributed.collective_counters()
    dist.destroy_process_group()


def tensors_held_until_done(device):
    """An async collective whose caller drops its input at once: the engine works on aliases
    that do not own brick memory, so brick must hold the tensor until the collective is done.
    Rank 1 joins late, so rank 0's collective is still pending when it drops the input."""
    import time

    numel = 1 << 20
    out = torch.empty(numel * WORLD, device=device)
    torch.brick.synchronize(device)
    if RANK == 1:
        time.sleep(0.5)
    before = torch.brick.memory_allocated(device)
    source = torch.full((numel,), float(RANK + 1), device=device)
    work = dist.all_gather_into_tensor(out, source, async_op=True)
    del source
    kept = torch.brick.memory_allocated(device) - before  # still held while pending
    pending = not work.is_completed()
    work.wait()
    torch_brickdev.distributed.wait_for_collectives()
    released = torch.brick.memory_allocated(device) - before
    expected = torch.cat([torch.full((numel,), float(r + 1)) for r in range(WORLD)])
    return {"pending": pending, "kept_bytes": kept, "released_bytes": released,
            "input_bytes": numel * 4, "result_ok": torch.equal(out.cpu(), expected)}


def training():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    if sys.argv[3:] == ["bare"]:  # the documented bare form: what "brick" gives
        dist.init_process_group(timeout=TIMEOUT)
    else:
        dist.init_process_group("cpu:gloo,brick:brick", timeout=TIMEOUT)
    torch.brick.set_device(RANK % torch.brick.device_count())

    def run(device, wrap):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to(device)
        model = wrap(model, device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(100 + RANK)
        losses = []
        for _ in range(4):
            x, y = torch.randn(8, 16, generator=data).to(device), torch.randn(8, 4, generator=data).to(device)
            loss = ((model(x) - y) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        params = [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().flatten().tolist()
                  for p in model.parameters()]
        out = {"losses": losses, "params": params}
        if isinstance(model, DistributedDataParallel):  # DDP's runtime stats (its timer's)
            logged = model._get_ddp_logging_data()
            out["ddp_stats"] = {k: logged.get(k, 0) for k in (
                "avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time")}
        return out

    def ddp(model, device):
        return DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets

    def fsdp(model, device):
        mesh = init_device_mesh(device.type, (WORLD,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    brick = torch.device("brick", RANK % torch.brick.device_count())
    for name, wrap in (("ddp", ddp), ("fsdp", fsdp)):
        results[name] = {"brick": run(brick, wrap), "cpu": run(torch.device("cpu"), wrap)}
    dist.destroy_process_group()


def bad_input():
    dist.init_process_group(timeout=TIMEOUT)  # no backend: brick is the accelerator
    results["default_backend"] = str(dist.get_backend())
    here = RANK % torch.brick.device_count()
    torch.brick.set_device(here)
    t = torch.ones(4, device=f"brick:{here}")
    dist.all_reduce(t)
    results["default_all_reduce"] = t.cpu().tolist()
    other = torch.ones(4, device=f"brick:{(here + 1) % torch.brick.device_count()}")
    results["other_device"] = error_of(lambda: dist.all_reduce(other))
    dist.all_reduce(t)  # the group still works after the refused call
    results["after_error"] = t.cpu().tolist()
    dist.destroy_process_group()
    results["after_destroy"] = error_of(lambda: dist.all_reduce(t))


def traced_steps():
    """Per-rank torch.profiler traces for HolisticTraceAnalysis: each step overlaps an async
    all_reduce with compute, then ``argv[3]`` (the straggler) sleeps before the step's last
    all_reduce, which the other rank then waits in."""
    import time

    straggler = int(sys.argv[3])
    dist.init_process_group("brick", timeout=TIMEOUT)
    device = torch.device("brick", RANK % torch.brick.device_count())
    torch.brick.set_device(device)
    a = torch.randn(128, 128, device=device)
    big = torch.randn(1 << 20, device=device)  # 4 MiB: milliseconds of gloo on loopback
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]
    handler = torch.profiler.tensorboard_trace_handler(os.path.join(OUT, "traces"),
                                                       worker_name=f"rank{RANK}")
    with torch.profiler.profile(activities=activities, on_trace_ready=handler,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=4)) as prof:
        for _ in range(5):
            work = dist.all_reduce(big, async_op=True)
            for _ in range(8):
                a = torch.tanh(a @ a)
            work.wait()
            if RANK == straggler:
                # Far above what scheduling delays a rank on a loaded machine (30 ms once lost to
                # them, with a busy-loop holding one of 2 cores under the whole suite).
                time.sleep(0.1)
            dist.all_reduce(a)
            prof.step()
    results["counters"] = torch_brickdev.distributed.collective_counters()
    dist.destroy_process_group()


def premul_sum(factor):
    """NCCL's pre-multiplied sum: a ReduceOp made by PyTorch's factory (ReduceOp.PREMUL_SUM is
    only its type)."""
    return dist._make_nccl_premul_sum(factor)


def nccl_on_cuda_backing():
    """CUDA backing: brick tensors' collectives run on NCCL, ordered with brick's current stream;
    each result equals the same collective on plain cuda tensors (NCCL too), one rank per GPU."""
    dist.init_process_group("cpu:gloo,cuda:nccl,brick:brick", timeout=TIMEOUT)
    local = RANK % torch.cuda.device_count()
    torch.cuda.set_device(local)
    torch.brick.set_device(local)
    cuda = torch.device("cuda", local)

    def base(d):
        return (torch.arange(8, dtype=torch.float32) + 1 + RANK * 10).to(d)

    def both(fn):
        return on_both(fn, baseline=cuda)

    for name, op in (("SUM", dist.ReduceOp.SUM), ("MAX", dist.ReduceOp.MAX),
                     ("AVG", dist.ReduceOp.AVG), ("PREMUL_SUM", premul_sum(0.5))):
        def all_reduce(d, op=op):
            t = base(d) * 3  # made on the current stream just before: NCCL must order after it
            dist.all_reduce(t, op=op)
            return t
        results[f"all_reduce_{name}"] = both(all_reduce)

    results.update(common_collectives(base, 8, both, broadcast_src=0))
    dist.barrier()

    # The future orders the caller's stream after NCCL (its wait() does not block the host on a
    # CUDA future): a big all_reduce's result read through the future alone is the reduced one.
    brick = torch.device("brick", local)
    numel = 1 << 24
    big = torch.full((numel,), float(RANK + 1), device=brick)
    future = dist.all_reduce(big, async_op=True).get_future()
    reduced = future.wait()[0]
    total = float(sum(range(1, WORLD + 1)))
    results["future_orders_after_nccl"] = {
        "brick": [[float(reduced.min().item()), float(reduced.max().item())]],
        "cuda": [[total, total]]}
    # Memory of a dropped input is not reused under NCCL: new tensors made right after on the
    # same stream would take its block if brick did not hold it until NCCL's stream passes.
    gathered = torch.empty(numel * WORLD, device=brick)
    work = dist.all_gather_into_tensor(gathered, torch.full((numel,), float(RANK + 1), device=brick),
                                       async_op=True)
    scribbles = [torch.full((numel,), -7.0, device=brick) for _ in range(4)]
    work.wait()
    expected = torch.cat([torch.full((numel,), float(r + 1)) for r in range(WORLD)])
    results["dropped_input_kept_for_nccl"] = {
        "brick": [[bool(torch.equal(gathered.cpu(), expected))]], "cuda": [[True]]}
    del scribbles
    torch.brick.synchronize()
    torch_brickdev.distributed.wait_for_collectives()
    counters = torch_brickdev.distributed.collective_counters()
    results["all_gather_device_ns"] = counters["all_gather_into_tensor"]["time_ns"]

    from torch.nn.parallel import DistributedDataParallel

    def ddp_losses(d):
        torch.manual_seed(0)
        model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.GELU(),
                                                      nn.Linear(32, 4)).to(d))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.Generator().manual_seed(100 + RANK)
        losses = []
        for _ in range(3):
            x, y = torch.randn(8, 16, generator=data).to(d), torch.randn(8, 4, generator=data).to(d)
            loss = ((model(x) - y) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return torch.tensor(losses, device=d)
    results["ddp_losses"] = both(ddp_losses)
    torch.brick.synchronize()
    results["counters"] = torch_brickdev.distributed.collective_counters()
    dist.destroy_process_group()


def _outlive_the_failed_rank():
    # torchrun sends SIGTERM to the other ranks once one fails: this rank must still record
    # what its collective raised (it ends in well under a second; the test bounds the launch).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def mismatched():
    _outlive_the_failed_rank()
    # Sizes that differ across ranks: gloo's transport aborts the receiving rank with its own
    # message (as for CPU tensors); the other rank's collective fails. Never a hang.
    dist.init_process_group("brick", timeout=datetime.timedelta(seconds=20))
    torch.brick.set_device(RANK % torch.brick.device_count())
    t = torch.ones(4 + RANK, device="brick")
    results["mismatched"] = error_of(lambda: dist.all_reduce(t))


def dead_rank():
    _outlive_the_failed_rank()
    dist.init_process_group("brick", timeout=datetime.timedelta(seconds=20))
    torch.brick.set_device(RANK % torch.brick.device_count())
    t = torch.ones(4, device="brick")
    dist.all_reduce(t)
    if RANK == 1:
        os._exit(3)  # dies before the next collective
    results["survivor"] = error_of(lambda: dist.all_reduce(t))


{"collectives": collectives, "training": training, "traced_steps": traced_steps,
 "nccl_on_cuda_backing": nccl_on_cuda_backing,
 "bad_input": bad_input,
 "mismatched": mismatched, "dead_rank": dead_rank}[SCENARIO]()
partial = os.path.join(OUT, f".rank{RANK}.json.partial")
with open(partial, "w") as f:
    json.dump(results, f)
os.replace(partial, os.path.join(OUT, f"rank{RANK}.json"))  # whole or absent, never half
