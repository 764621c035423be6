"""torch.distributed on brick: brick's c10d backend, DDP and FSDP2, profiles across ranks.

Every multi-process test launches 2 ranks with torchrun on loopback (distributed_worker.py runs
the scenario and writes each rank's results); each launch is bounded by a subprocess timeout,
and the worker's process groups by a 20-30 s collective timeout, so a hang fails with a message.
"""

import json
import os

import pytest
import torch
import torch.distributed as dist

import torch_brickdev
import torch_brickdev.profiler as bp
from helpers import run_cli, run_torchrun

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "distributed_worker.py")
EXAMPLE = os.path.join(HERE, os.pardir, os.pardir, "examples", "ddp_train.py")
host_only = pytest.mark.skipif(torch_brickdev.backing_device_type() != "cpu",
                               reason="the gloo-backed engine is the host runtime's")


def torchrun(*args, timeout=180, nproc=2):
    """``torchrun --standalone --nproc-per-node 2 *args``; the completed process."""
    return run_torchrun(nproc, *args, timeout=timeout)


def scenario(name, tmp_path, expect_rc=0, *args, nproc=2):
    out = torchrun(WORKER, name, str(tmp_path), *map(str, args), nproc=nproc)
    if expect_rc is not None:
        assert out.returncode == expect_rc, out.stderr[-4000:]
    ranks = {}
    for rank in range(nproc):
        path = tmp_path / f"rank{rank}.json"
        if path.exists():
            ranks[rank] = json.loads(path.read_text())
    return ranks, out


def test_the_backend_is_registered_on_import():
    assert torch_brickdev.distributed.is_registered()
    assert dist.Backend.default_device_backend_map["brick"] == "brick"
    assert set(dist.Backend.backend_capability["brick"]) == {"brick", "cpu"}


@host_only
def test_every_collective_on_brick_equals_gloo_on_the_cpu(tmp_path):
    ranks, _ = scenario("collectives", tmp_path)
    assert set(ranks) == {0, 1}
    for rank, results in ranks.items():
        counters = results.pop("counters")
        held = results.pop("held")
        assert held["result_ok"], (rank, held)
        if rank == 0:  # its collective waited for the late rank 1
            assert held["pending"], held
            assert held["kept_bytes"] >= held["input_bytes"], ("dropped input freed early", held)
        assert held["released_bytes"] < held["input_bytes"], ("input never released", held)
        for name, reduced in results.pop("reduce_ops").items():
            assert reduced["all_reduce"] == reduced["expected"], (rank, name, reduced)
            assert reduced["reduce_scatter"] == reduced["expected_shard"], (rank, name, reduced)
            assert reduced["input_kept"], (rank, name)  # a reduce-scatter's input is not scaled
        assert len(results) >= 18, sorted(results)
        for name, both in results.items():
            assert "error" not in both, (rank, name, both)
            assert both["brick"] == both["cpu"], (rank, name, both)
        # Counted: every collective kind shows with its calls and the group size (barrier goes to
        # the CPU's gloo in a 'cpu:gloo,brick:brick' group).
        for kind in ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
                     "gather", "scatter", "reduce_scatter_tensor", "all_to_all_single"):
            assert counters[kind]["calls"] >= 1 and counters[kind]["group_size"] == 2, kind
        assert counters["all_reduce"]["bytes"] > 0
        # Timed from enqueue to completion where the engine's Work has a future to say when it
        # completed; gloo's reduce_scatter_tensor, send and recv have none: counted, not timed.
        for kind, figures in counters.items():
            if kind in ("reduce_scatter_tensor", "send", "recv"):
                assert figures["timed_calls"] == 0 and figures["time_ns"] == 0, kind
            else:
                assert figures["timed_calls"] == figures["calls"] and figures["time_ns"] > 0, kind
    sums = ranks[0]["all_reduce_SUM"]["brick"][0]
    assert sums == [float(2 * i + 2 + 10) for i in range(6)]  # (i+1) + (i+11)


@host_only
@pytest.mark.parametrize("init_form", ["cpu:gloo,brick:brick", "bare"])
def test_ddp_and_fsdp2_on_brick_equal_the_cpu_run_step_for_step(tmp_path, init_form):
    """Also with ``init_process_group()`` and no backend, as the README shows: PyTorch's bare form
    alone makes gloo the default backend type of a group that has none (DDP fails to construct,
    FSDP2 warns); brick gives it what ``init_process_group("brick")`` gives."""
    args = ["bare"] if init_form == "bare" else []
    ranks, out = scenario("training", tmp_path, 0, *args)
    assert "No backend of type 1" not in out.stderr  # (gloo's type, in a group without gloo)
    # DDP times brick modules with brick's timer (device events), as CUDA's: no warning, and its
    # runtime stats are measured.
    assert "Time stats are currently only collected" not in out.stderr
    for results in ranks.values():
        assert all(v > 0 for v in results["ddp"]["brick"]["ddp_stats"].values()), results["ddp"]
    for rank, results in ranks.items():
        for name in ("ddp", "fsdp"):
            brick, cpu = results[name]["brick"], results[name]["cpu"]
            assert brick["losses"] == cpu["losses"], (rank, name)
            assert brick["params"] == cpu["params"], (rank, name)
    # DDP keeps replicas equal across ranks; both ranks trained on their own data.
    assert ranks[0]["ddp"]["brick"]["params"] == ranks[1]["ddp"]["brick"]["params"]
    assert ranks[0]["ddp"]["brick"]["losses"] != ranks[1]["ddp"]["brick"]["losses"]


@host_only
def test_bad_input_is_refused_naming_rank_and_collective(tmp_path):
    ranks, _ = scenario("bad_input", tmp_path)
    for rank, results in ranks.items():
        assert results["default_all_reduce"] == [2.0] * 4  # init_process_group() with no backend
        message = results["other_device"]
        assert message.startswith(f"ValueError: brick c10d: rank {rank} of 2: all_reduce")
        assert "this rank's collectives run on brick:" in message
        assert results["after_error"] == [4.0] * 4  # the group is intact after the refusal
        assert "has not been initialized" in results["after_destroy"]


@host_only
@pytest.mark.parametrize("case", ["dead_rank", "mismatched"])
def test_a_dead_rank_or_a_size_mismatch_is_an_error_not_a_hang(tmp_path, case):
    ranks, out = scenario(case, tmp_path, expect_rc=None)
    assert out.returncode != 0  # torchrun reports the failed rank
    messages = [r.get("survivor") or r.get("mismatched") for r in ranks.values()]
    assert messages, out.stderr[-3000:]
    for message in messages:
        assert "DistBackendError: brick c10d: rank" in message and "all_reduce failed" in message
    if case == "mismatched":  # the receiving rank stops with gloo's own diagnosis
        assert "Received data size doesn't match expected size" in out.stderr


@host_only
def test_profile_under_torchrun_then_merge_across_ranks(tmp_path):
    out = torchrun("-m", "torch_brickdev", "profile", "-o", str(tmp_path / "out"), EXAMPLE,
                   "--steps", "3", "--width", "64")
    assert out.returncode == 0, out.stderr[-4000:]
    reports = [tmp_path / "out" / f"rank{r}" / "report.json" for r in (0, 1)]
    for rank, path in enumerate(reports):
        report = bp.load_report(str(path))
        assert report.metadata["distributed"]["rank"] == rank
        assert report.metadata["distributed"]["world_size"] == 2
        collectives = report.metadata["collectives"]
        assert collectives["all_reduce"]["calls"] >= 3 and collectives["all_reduce"]["bytes"] > 0
        assert collectives["all_reduce"]["timed_calls"] == collectives["all_reduce"]["calls"]
        assert collectives["all_reduce"]["time_ns"] > 0
        assert "all_reduce: " in report.table() and "ms in the collective" in report.table()
        assert report.metadata["distributed"]["backend"] == "brick"  # known after destroy too
        assert report.brick("gloo:all_reduce").count == collectives["all_reduce"]["calls"]
        assert report.brick("TrainStep").count == 3
        trace = json.loads((path.parent / "trace.json").read_text())
        assert trace["distributedInfo"]["rank"] == rank
        assert trace["distributedInfo"]["world_size"] == 2
    merged = run_cli("merge", *map(str, reports))
    assert merged.returncode == 0, merged.stderr
    assert "2 ranks (0, 1) of world size 2" in merged.stdout
    data = json.loads((tmp_path / "out" / "merged_report.json").read_text())
    step = next(b for b in data["bricks"] if b["name"] == "TrainStep")
    assert step["calls"] == [3, 3] and step["min_ns"] <= step["median_ns"] <= step["max_ns"]
    assert step["slowest_rank"] in (0, 1) and step["max_ns"] == max(step["total_ns"])
    assert data["collectives"]["all_reduce"]["group_size"] == [2, 2]


def _report(rank, world, totals):
    with bp.profile(metadata={"distributed": {"rank": rank, "world_size": world}}) as p:
        for name, count in totals.items():
            for _ in range(count):
                with torch.profiler.record_function(name):
                    pass
    return p.report


def test_merge_reports_lines_ranks_up_and_refuses_bad_sets(tmp_path):
    a, b = _report(1, 2, {"Step": 2, "OnlyHere": 1}), _report(0, 2, {"Step": 2})
    merged = bp.merge_reports([a, b])
    assert merged.ranks == [0, 1] and merged.world_size == 2  # sorted by rank
    only = merged.brick("OnlyHere")
    assert only.calls == [0, 1] and only.missing_on == [0] and only.slowest([0, 1]) == 1
    assert "missing on rank(s) [0]" in merged.table()
    path = merged.write_json(tmp_path / "merged.json")
    assert json.loads(open(path).read())["format"] == "torch_brickdev.merged_report"
    with pytest.raises(ValueError, match=r"rank\(s\) 1 appear in more than one report"):
        bp.merge_reports([a, a])
    with pytest.raises(ValueError, match="different world sizes"):
        bp.merge_reports([a, _report(0, 4, {"Step": 1})])
    with pytest.raises(ValueError, match="no reports to merge"):
        bp.merge_reports([])
    with pytest.raises(TypeError, match="list of report paths"):
        bp.merge_reports(str(path))
    bad = run_cli("merge", str(tmp_path / "absent.json"))
    assert bad.returncode == 2 and "absent.json" in bad.stderr


needs_kineto_plugin = pytest.mark.skipif(not bp.kineto_available(),
                                         reason="this PyTorch has no Kineto PrivateUse1 registry")


@host_only
@needs_kineto_plugin
@pytest.mark.parametrize("straggler", [0, 1])
def test_holistic_trace_analysis_runs_its_multi_rank_analyses_on_brick_traces(tmp_path, straggler):
    hta = pytest.importorskip("hta.trace_analysis")
    ranks, _ = scenario("traced_steps", tmp_path, 0, straggler)
    trace_dir = tmp_path / "traces"
    files = sorted(os.listdir(trace_dir))
    assert len(files) == 2, files
    for name in files:  # each collective is device work on its rank's collectives track
        trace = json.loads((trace_dir / name).read_text())
        rank = trace["distributedInfo"]["rank"]
        assert trace["distributedInfo"]["world_size"] == 2
        collectives = [e for e in trace["traceEvents"] if e.get("name") == "brick::gloo:all_reduce"]
        assert collectives and all(e["cat"] == "kernel" for e in collectives)
        assert {e["args"]["bytes"] for e in collectives} == {4 << 20, 128 * 128 * 4}
        assert {e["args"]["group size"] for e in collectives} == {2}
        assert {e["args"]["device"] for e in collectives} == {rank % torch.brick.device_count()}
    analysis = bp.trace_analysis(str(trace_dir))
    assert isinstance(analysis, hta.TraceAnalysis)
    assert analysis.get_profiler_steps() == [1, 2, 3]  # HTA leaves out the last, unfinished one
    # The async all_reduce overlaps the matmuls on both ranks.
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    assert set(overlap.index) == {0, 1}
    assert all(0 < value <= 100 for value in overlap.iloc[:, 0]), overlap
    # The rank that starts the step's last all_reduce late is the straggler, in every step.
    assert analysis.get_potential_stragglers(
        num_candidates=1, straggler_identification_impl=bp.late_collective_stragglers) == [straggler]
    breakdown = analysis.get_temporal_breakdown(visualize=False)
    assert list(breakdown["rank"]) == [0, 1] and (breakdown["compute_time(us)"] > 0).all()
    with pytest.raises(FileNotFoundError, match="no such folder"):
        bp.trace_analysis(str(tmp_path / "absent"))


def test_late_collective_stragglers_compares_the_ranks_at_one_collective():
    """The straggler arrives last at each step's second collective, which is therefore brief on
    it (below the 1 % significance bar) and long on the rank that waits. Comparing each rank's
    last long collective would set the straggler's first collective against the other rank's
    second and blame the waiting rank; matched by order, the ranks are compared at the second."""
    pd = pytest.importorskip("pandas")
    pytest.importorskip("hta.analyzers.straggler")
    names = {"brick::gloo:all_reduce": 7, "aten::mm": 8, "ProfilerStep#1": 9}
    symbols = type("Symbols", (), {"get_sym_id_map": lambda self: names})()
    rows = []
    for iteration in (1, 2, 3):
        step = iteration * 100.0
        for rank, second_start, second_dur in ((0, 30.0, 40.0), (1, 69.0, 0.5)):
            rows += [(rank, iteration, 20, 7, step + 5, 20.0),  # first all_reduce, both long
                     (rank, iteration, 7, 8, step + 26, 3.0),  # compute
                     (rank, iteration, 20, 7, step + second_start, second_dur)]
    df = pd.DataFrame(rows, columns=["rank", "iteration", "stream", "name", "ts", "dur"])
    found = bp.late_collective_stragglers(df, symbols, n_stragglers=1)
    assert dict(found) == {0: 0, 1: 3}  # the straggler, in each of the 3 steps
    # Without rank 1's second collective, the last one every rank has is the first.
    lone = df.loc[~((df["rank"] == 1) & (df["ts"] % 100 == 69))].copy()
    lone.loc[(lone["rank"] == 0) & (lone["ts"] % 100 == 5), "ts"] += 2
    assert dict(bp.late_collective_stragglers(lone, symbols, n_stragglers=1)) == {0: 3, 1: 0}
    with pytest.raises(ValueError, match="no collective of at least 50%"):
        bp.late_collective_stragglers(df, symbols, min_normalized_duration=0.5)


@host_only
def test_train_nproc_runs_ddp_on_brick_beside_the_cpu_and_merges_the_profiles(tmp_path):
    out = tmp_path / "train"
    done = run_cli("train", "--nproc", "2", "--steps", "3", "--width", "64", "--depth", "1",
                   "--batch", "16", "-o", str(out), "--timeout", "240", timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    # DDP on brick equals DDP on the CPU exactly, on every rank.
    assert "largest difference brick vs cpu over all ranks: loss 0.00e+00, parameters 0.00e+00" \
        in done.stdout
    assert "2 ranks (0, 1) of world size 2" in done.stdout
    merged = json.loads((out / "merged_report.json").read_text())
    step = next(b for b in merged["bricks"] if b["name"] == "TrainStep")
    assert step["calls"] == [3, 3]  # the profiled steps
    assert merged["collectives"]["all_reduce"]["group_size"] == [2, 2]
    assert all(t > 0 for t in merged["collectives"]["all_reduce"]["time_ns"])
    for rank in (0, 1):
        report = bp.load_report(str(out / f"rank{rank}" / "report.json"))
        assert report.metadata["distributed"]["rank"] == rank
        assert report.brick("gloo:all_reduce").count == report.metadata["collectives"]["all_reduce"]["calls"]
    bad = run_cli("train", "--nproc", "0")
    assert bad.returncode == 2 and "--nproc: expected a positive integer, got 0" in bad.stderr


@pytest.mark.skipif(torch_brickdev.backing_device_type() != "cuda",
                    reason="NCCL is the engine of CUDA-backed brick")
def test_nccl_collectives_and_ddp_on_cuda_backed_brick_equal_plain_cuda(tmp_path):
    # One rank per GPU: NCCL refuses two ranks on one device.
    nproc = min(2, torch.cuda.device_count())
    ranks, _ = scenario("nccl_on_cuda_backing", tmp_path, 0, nproc=nproc)
    assert set(ranks) == set(range(nproc))
    for rank, results in ranks.items():
        counters = results.pop("counters")
        assert results.pop("all_gather_device_ns") > 0
        for name, both in results.items():
            assert both["brick"] == both["cuda"], (rank, name, both)
        assert counters["all_reduce"]["calls"] >= 5 and counters["all_reduce"]["group_size"] == nproc
        assert counters["all_reduce"]["timed_calls"] == counters["all_reduce"]["calls"]
    expected = [3.0 * sum(i + 1 + r * 10 for r in range(nproc)) for i in range(8)]
    assert ranks[0]["all_reduce_SUM"]["brick"][0] == expected
