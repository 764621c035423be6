"""``python -m torch_brickdev``: command-line entry point.

Commands:
  demo     decode tokens with a Qwen-style model on brick, profile every block, check the
           decode-profiling contract, write report.json and trace.json
  check    check a report against a profiling contract (default: the decode contract)
  profile  run a Python script (or -m module) with the brick profiler on, as python would run
           it; write its report and trace
  train    train a small model on a brick device and on the CPU side by side (--nproc N:
           DistributedDataParallel on N ranks, with the merged profile)
  merge    merge the ranks' report.json files of a distributed run into one cross-rank table
  diff     compare two reports brick by brick; exit 1 when a brick regressed
  top      a live view of the bricks of running processes (profile --live, BRICK_LIVE=1)
"""

import argparse
import copy
import json
import os
import sys
from typing import TYPE_CHECKING

# Only what every command needs: the commands that read JSON (check, diff, merge, top, and every
# --help) never load torch; the others call _load_torch() first.
from torch_brickdev.profiler._stats import DEVICE_TIMINGS, OP_TIMINGS, SyncMode, shapes_refused
from torch_brickdev.tools._args import fraction, positive_int

# Exit status when standard output is a pipe whose reader left (`... | head -1`): 128 + SIGPIPE,
# what a shell shows for a program that signal ended; 1 would read as a regression here.
EXIT_CLOSED_PIPE = 141

if TYPE_CHECKING:
    import torch


def _load_torch() -> None:
    """torch and brick, registered as ``import torch_brickdev`` registers it: ``python -m
    torch_brickdev`` defers that to the commands that run torch (see torch_brickdev._start)."""
    import torch_brickdev

    torch_brickdev._start()


def _brick_device(text: str) -> "torch.device":
    _load_torch()
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: {error}") from None
    if device.type != "brick":
        raise argparse.ArgumentTypeError(f"expected a brick device such as brick:0, got {text}")
    index = 0 if device.index is None else device.index
    if index >= torch.brick.device_count():
        raise argparse.ArgumentTypeError(
            f"{text}: there are {torch.brick.device_count()} brick device(s)"
        )
    return torch.device("brick", index)


def train(args) -> int:
    if args.nproc is not None:
        return train_distributed(args)
    _load_torch()
    import torch

    import torch_brickdev
    from torch_brickdev.tools.training import residual_mlp, steady_ratio, train_steps

    torch.manual_seed(args.seed)
    cpu_model = residual_mlp(args.width, args.depth, 10)
    brick_model = copy.deepcopy(cpu_model).to(args.device)
    data = torch.randn(args.batch, args.width)
    targets = torch.randint(0, 10, (args.batch,))
    params = sum(p.numel() for p in cpu_model.parameters())
    print(f"torch {torch.__version__}; brick runtime: {torch_brickdev.runtime_name()} "
          f"(backing device: {torch_brickdev.backing_device_type()}), "
          f"{torch.brick.device_count()} device(s)")
    print(f"model: {args.depth} residual MLP blocks, width {args.width}, {params:,} parameters; "
          f"batch {args.batch}; {args.steps} AdamW steps on {args.device} and on cpu")
    torch.brick.reset_peak_memory_stats(args.device)
    brick_losses, brick_times = train_steps(brick_model, data.to(args.device), targets.to(args.device),
                                            args.steps)
    cpu_losses, cpu_times = train_steps(cpu_model, data, targets, args.steps)
    print(f"\n{'step':>4}  {'loss (brick)':>12}  {'loss (cpu)':>12}  {'ms (brick)':>10}  {'ms (cpu)':>9}")
    for step, (lb, lc, tb, tc) in enumerate(zip(brick_losses, cpu_losses, brick_times, cpu_times)):
        print(f"{step:>4}  {lb:>12.6f}  {lc:>12.6f}  {tb * 1e3:>10.2f}  {tc * 1e3:>9.2f}")
    worst = max(abs(a - b) for a, b in zip(brick_losses, cpu_losses))
    ratio = steady_ratio(brick_times, cpu_times)
    stats = torch.brick.memory_stats(args.device)
    print(f"\nlargest loss difference brick vs cpu: {worst:.2e}")
    print(f"step time brick / cpu (after the first step): {ratio:.3f}x")
    print(f"{args.device} memory: {stats['allocated_bytes.all.current'] / 2**20:.2f} MiB allocated, "
          f"peak {stats['allocated_bytes.all.peak'] / 2**20:.2f} MiB, "
          f"{stats['allocation.all.allocated']:,} allocations in total")
    if worst > 1e-3:
        print("error: brick and cpu diverged", file=sys.stderr)
        return 1
    return 0


def train_distributed(args) -> int:
    """``train --nproc N``: torchrun runs N ranks of the DDP training demo (tools/ddp_train.py),
    each on its own brick device beside the CPU; then the ranks' reports are merged."""
    import signal
    import subprocess

    import torch_brickdev.profiler as bp

    output = args.output
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(args.nproc), "-m", "torch_brickdev.tools.ddp_train",
               "--width", str(args.width), "--depth", str(args.depth), "--batch", str(args.batch),
               "--steps", str(args.steps), "--seed", str(args.seed), "--output", output]
    print(f"running: {' '.join(command[2:])}", flush=True)
    launcher = subprocess.Popen(command, start_new_session=True)  # its ranks: one process group
    try:
        code = launcher.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        print(f"error: the {args.nproc} ranks ran past --timeout {args.timeout} s; stopped",
              file=sys.stderr)
        return 1
    if code != 0:
        print(f"error: torchrun exited with {code} (see the ranks' messages above)", file=sys.stderr)
        return 1
    reports = [os.path.join(output, f"rank{rank}", "report.json") for rank in range(args.nproc)]
    merged = bp.merge_reports(reports)
    print()
    print(merged.table(row_limit=args.rows))
    print(f"\nmerged report: {merged.write_json(os.path.join(output, 'merged_report.json'))}")
    return 0


def decode_demo(args) -> int:
    from torch_brickdev.tools.demo.config import (LEGACY_NEEDS_DISPATCHER, DecodeConfig,
                                                  legacy_refused)

    config = DecodeConfig(
        layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
        vocab=args.vocab, prompt_tokens=args.prompt_tokens, tokens=args.tokens, seed=args.seed,
    )
    try:
        config.validate()  # before any work
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if legacy_refused(args.ops, args.legacy):
        print(f"error: --legacy {LEGACY_NEEDS_DISPATCHER}: drop --ops kernels", file=sys.stderr)
        return 2
    _load_torch()
    import torch

    from torch_brickdev.tools import demo as decode

    torch.set_num_threads(args.threads if args.threads is not None else decode.default_threads())
    result = decode.run_demo(config, device=args.device, sync_mode=args.sync_mode, runs=args.runs,
                             out_dir=args.output, legacy=args.legacy, progress=not args.no_progress,
                             compile=args.compile, ops=args.ops,
                             device_timing=args.device_timing)
    print(decode.format_summary(result))
    from torch_brickdev.tools import contract

    results = contract.run_checks(result["report"])
    print()
    print(contract.format_results(results))
    return contract.exit_status(results)


def profile_script(args) -> int:
    """Runs a script (or ``-m module``) under the brick registry (and, for the trace, PyTorch's
    legacy profiler with brick's stubs), like ``nsys profile``, as ``python`` would run it
    (tools.script_target). When it raises or is interrupted, the report of what ran is written,
    marked incomplete, and the process ends as python's would have."""
    from torch_brickdev.tools.script_target import TargetError, end_as_python_would, ended_early

    target = args.target
    try:
        target.check()
    except TargetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    option = shapes_refused(args.ops, args.record_shapes, args.roofline)
    if option is not None:
        print(f"error: --ops kernels records no input shapes: drop --{option.replace('_', '-')}",
              file=sys.stderr)
        return 2
    _load_torch()
    import torch

    import torch_brickdev.profiler as bp
    from torch_brickdev.distributed import group_info
    from torch_brickdev.tools.quiet_kineto import QuietProfile

    # Under torchrun every rank profiles itself: each writes to its own folder.
    rank = group_info()
    if rank is not None and rank["world_size"] > 1:
        args.output = os.path.join(args.output, f"rank{rank['rank']}")
    os.makedirs(args.output, exist_ok=True)
    ended = None  # the target's exception, SystemExit included: passed on at the end
    legacy = torch.autograd.profiler.profile(use_device="brick") if args.trace else None
    quiet_legacy = QuietProfile(legacy) if legacy is not None else None
    try:
        if quiet_legacy is not None:
            quiet_legacy.__enter__()
        with bp.profile(sync_mode=args.sync_mode, modules=args.modules, live=args.live or None,
                        record_shapes=args.record_shapes, roofline=args.roofline, ops=args.ops,
                        device_timing=args.device_timing, metadata=target.metadata()) as p:
            try:
                target.run()
            except BaseException as error:  # Ctrl-C too: what ran is reported
                ended = error
    finally:
        if quiet_legacy is not None:
            quiet_legacy.__exit__(None, None, None)
    report = p.report
    why = ended_early(target, ended) if ended is not None else None
    if why is not None:
        report = report.with_metadata(incomplete=why)
    report_path = report.write_json(os.path.join(args.output, "report.json"))
    print(report.table(row_limit=args.rows))
    if args.modules and report.module_times():
        print()
        print(report.table(by="module", row_limit=args.rows))
    if args.record_shapes and report.shape_stats():
        print()
        print(report.table(by="shape", row_limit=args.rows))
    if args.roofline and report.roofline():
        print()
        print(report.table(roofline=True, row_limit=args.rows))
    print(f"\nreport: {report_path}" + (" (incomplete: what ran)" if why is not None else ""))
    if legacy is not None:
        trace_path = bp.export_chrome_trace(legacy, os.path.join(args.output, "trace.json"),
                                            report=report if args.roofline else None)
        print(f"trace:  {trace_path} (open in ui.perfetto.dev)")
    if ended is not None:
        end_as_python_would(ended)
    return 0


def merge_ranks(args) -> int:
    import torch_brickdev.profiler as bp

    try:
        merged = bp.merge_reports(args.reports)
    except (OSError, ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(merged.table(row_limit=args.rows))
    output = args.output or os.path.join(os.path.dirname(os.path.abspath(args.reports[0])),
                                         os.pardir, "merged_report.json")
    print(f"\nmerged report: {merged.write_json(os.path.normpath(output))}")
    return 0


def diff(args) -> int:
    import torch_brickdev.profiler as bp

    try:
        base = bp.load_report(args.base, where="diff", arg="base")
        new = bp.load_report(args.new, where="diff", arg="new")
    except bp.ReportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    result = bp.diff_reports(base, new, threshold=args.threshold, by=args.by,
                             ignore_counts=args.ignore_counts, min_share=args.min_share)
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2))
    elif args.format == "markdown":
        print(result.markdown(row_limit=args.rows, all_rows=args.all, all_rows_option="--all"))
    else:
        print(result.table(row_limit=args.rows, all_rows=args.all, all_rows_option="--all"))
    return 1 if not result.passed else 3 if result.inconclusive else 0


_SYNC_MODES = [SyncMode.EVENT.value] + [m.value for m in SyncMode if m is not SyncMode.EVENT]


def _parser():
    """The command line's parser, and the profile command's options that take a value (they
    tell its options from the script's arguments: see script_target.split_command)."""
    parser = argparse.ArgumentParser(prog="python -m torch_brickdev", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    from torch_brickdev.tools.demo.config import DecodeConfig

    defaults = DecodeConfig()
    p = commands.add_parser("demo", help="profile a Qwen-style decode on brick and check the contract")
    p.add_argument("--device", type=_brick_device, default="brick:0")
    p.add_argument("--sync-mode", choices=_SYNC_MODES, default="event")
    p.add_argument("--layers", type=positive_int, default=defaults.layers)
    p.add_argument("--hidden", type=positive_int, default=defaults.hidden)
    p.add_argument("--heads", type=positive_int, default=defaults.heads)
    p.add_argument("--kv-heads", type=positive_int, default=defaults.kv_heads)
    p.add_argument("--vocab", type=positive_int, default=defaults.vocab)
    p.add_argument("--prompt-tokens", type=positive_int, default=defaults.prompt_tokens)
    p.add_argument("--tokens", type=positive_int, default=defaults.tokens,
                   help="tokens to decode (profiled)")
    p.add_argument("--runs", type=positive_int, default=5, help="repeated profiled decodes (stability)")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--output", "-o", default="brick_demo", help="folder for report.json and trace.json")
    p.add_argument("--legacy", action="store_true",
                   help="also compare key_averages() of the legacy profiler with the registry")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--ops", choices=OP_TIMINGS, default="dispatcher",
                   help="where the profiled runs time ops: every op the dispatcher runs "
                   "(default), or brick's kernels only (cheaper)")
    p.add_argument("--device-timing", choices=DEVICE_TIMINGS, default="events",
                   help="what gives event mode its device times: an event pair per brick "
                   "(default), or the device's own record of its work (CUPTI on a GPU)")
    p.add_argument("--compile", action="store_true",
                   help="compile the forward with torch.compile (Inductor), each block still a "
                   "brick; the warm-up decode compiles")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for the backing kernels (default: half the CPUs, at least 1, "
                   "so that another process on the machine does not stall every op)")
    p.set_defaults(run=decode_demo)

    p = commands.add_parser("merge", help="merge the ranks' reports of a distributed run")
    p.add_argument("reports", nargs="+", help="one report.json per rank (e.g. out/rank*/report.json)")
    p.add_argument("--output", "-o", default=None,
                   help="merged report path (default: merged_report.json beside the rank folders)")
    p.add_argument("--rows", type=positive_int, default=None, help="rows of the table")
    p.set_defaults(run=merge_ranks)

    p = commands.add_parser("check", add_help=False,
                            help="check a report.json against a profiling contract "
                            "(--contract FILE; default: the decode contract)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(run=None)  # main() hands check's arguments to contract.main as they are

    p = commands.add_parser("top", add_help=False,
                            help="a live view of the bricks of running processes (profile --live)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(run=None)  # main() hands top's arguments to tools.top as they are

    p = commands.add_parser("diff", help="compare two reports brick by brick (count, p50, p99, "
                            "total); exit 1 when a brick regressed, 3 when a slower brick's run "
                            "was denied the CPU")
    p.add_argument("base", help="the baseline report.json")
    p.add_argument("new", help="the report.json to judge")
    p.add_argument("--threshold", type=fraction, default=0.10,
                   help="relative change of a brick's median call that counts, when the runs' "
                   "spread does not explain it (default 0.10: 10 %%)")
    p.add_argument("--min-share", type=fraction, default=0.005,
                   help="a slower brick must add this share of the base wall time to fail "
                   "(default 0.005: 0.5 %%)")
    p.add_argument("--by", choices=["name", "path"], default="name",
                   help="compare bricks by name (default) or by call path")
    p.add_argument("--format", choices=["text", "json", "markdown"], default="text",
                   help="markdown: a table of the changed bricks for a CI comment")
    p.add_argument("--ignore-counts", action="store_true",
                   help="changed call counts and added or removed bricks do not fail")
    p.add_argument("--all", action="store_true",
                   help="list every brick (faster, noise, small, unchanged too)")
    p.add_argument("--rows", type=positive_int, default=None, help="rows of the table")
    p.set_defaults(run=diff)

    p = commands.add_parser("train", help="train a small model on brick and on the CPU side by side")
    p.add_argument("--device", type=_brick_device, default="brick:0")
    p.add_argument("--width", type=positive_int, default=256)
    p.add_argument("--depth", type=positive_int, default=4)
    p.add_argument("--batch", type=positive_int, default=64)
    p.add_argument("--steps", type=positive_int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--nproc", type=positive_int, default=None,
                   help="train with DistributedDataParallel on this many ranks (torchrun), each on "
                   "brick:<local rank> beside the CPU, and merge the ranks' profiles")
    p.add_argument("--output", "-o", default="brick_train",
                   help="with --nproc: folder for each rank's report.json and the merged report")
    p.add_argument("--rows", type=positive_int, default=20, help="with --nproc: rows of the table")
    p.add_argument("--timeout", type=positive_int, default=600,
                   help="with --nproc: seconds the ranks may run before they are stopped")
    p.set_defaults(run=train)

    # The script's arguments are its own, as for python: profile's options come first, and no
    # abbreviation of them, which could be read either way.
    p = commands.add_parser(
        "profile", allow_abbrev=False,
        usage="python -m torch_brickdev profile [options] (script | -m module) [args ...]",
        help="run a script (or -m module) with the brick profiler, as python would run it; "
        "write report.json and trace.json",
        description="Runs a script, or -m and a module, as python would run it (__main__, "
        "sys.argv, its folder first on sys.path), with the brick profiler on; writes report.json "
        "and trace.json. Every argument after the script (or the module) is the script's. When "
        "the script raises or is interrupted (Ctrl-C), the report of what ran is written, marked "
        "incomplete, and the command ends as python would have.")
    value_options = [
        p.add_argument("--sync-mode", choices=_SYNC_MODES, default="event"),
        p.add_argument("--output", "-o", default=".", help="folder for report.json and trace.json"),
        p.add_argument("--rows", type=positive_int, default=30, help="rows of the printed table"),
        p.add_argument("--ops", choices=OP_TIMINGS, default="dispatcher",
                       help="where ops are timed: every op the dispatcher runs (default), or "
                       "brick's kernels only (cheaper: no RecordFunction per op; no composites "
                       "or views)"),
        p.add_argument("--device-timing", choices=DEVICE_TIMINGS, default="events",
                       help="what gives event mode its device times: an event pair per brick "
                       "(default), or the device's own record of its work (CUPTI on a GPU), "
                       "each brick the sum of the work queued inside it"),
    ]
    p.add_argument("--no-trace", dest="trace", action="store_false",
                   help="skip the legacy profiler and the chrome trace (less overhead)")
    p.add_argument("--modules", action="store_true",
                   help="every nn.Module call a brick named by its qualified path, and the "
                   "module table (self and total time per module)")
    p.add_argument("--live", action="store_true",
                   help="publish the bricks while the script runs, for `python -m "
                   "torch_brickdev top`")
    p.add_argument("--record-shapes", action="store_true",
                   help="keep each op call's input shapes and dtypes, and print the table per "
                   "op and input shapes")
    p.add_argument("--roofline", action="store_true",
                   help="each brick's FLOPs and bytes, achieved GFLOP/s and GB/s and their share "
                   "of the backing device's measured peaks (records shapes; the peaks are "
                   "measured once per machine and cached)")
    p.set_defaults(run=profile_script)
    return parser, {flag for action in value_options for flag in action.option_strings}


def main(argv=None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            return _run(given)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, in this handler, not at the exit
    except BrokenPipeError:
        # `... | head -1`: the reader left; nothing more to say. stdout goes to devnull so that
        # the interpreter's flush at the exit does not report the pipe again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def _run(given) -> int:
    if given[:1] == ["check"]:
        # check's options come before its report too (argparse's REMAINDER would refuse them)
        from torch_brickdev.tools import contract
        return contract.main(given[1:], prog="python -m torch_brickdev check")
    if given[:1] == ["top"]:
        from torch_brickdev.tools import top
        return top.main(given[1:])
    parser, profile_value_options = _parser()
    if given[:1] != ["profile"]:
        args = parser.parse_args(given)
        return args.run(args)
    from torch_brickdev.tools.script_target import Target, TargetError, split_command

    options, command = split_command(given[1:], profile_value_options)
    args = parser.parse_args(["profile", *options])
    try:
        args.target = Target.parse(command)
    except TargetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
