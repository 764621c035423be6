"""The demo's run: :func:`run_demo` profiles repeated decodes of the model on brick with the
brick registry, writes ``report.json`` and a chrome ``trace.json`` from one legacy-profiled decode,
and :func:`format_summary` renders the result."""

from __future__ import annotations

import os
import sys
from typing import Optional, Union

import torch

import torch_brickdev  # noqa: F401  (registers brick)
from torch_brickdev import profiler as bp
from torch_brickdev.argcheck import check_bool, check_int, check_path, describe, describe_value
from torch_brickdev.profiler._stats import DEVICE_TIMINGS
from torch_brickdev.profiler.session import check_ops
from torch_brickdev.tools.demo.config import (LEGACY_NEEDS_DISPATCHER, DecodeConfig, _check_config,
                                              _check_device, legacy_refused)
from torch_brickdev.tools.demo.decoding import _decode, _percentile
from torch_brickdev.tools.demo.model import build_model
from torch_brickdev.tools.quiet_kineto import QuietProfile

__all__ = ["FINAL_TOKEN_NOTE", "default_threads", "format_summary", "run_demo"]

FINAL_TOKEN_NOTE = (
    "each decode step's LmHead produces the logits its token is sampled from; the prompt's "
    "prefill is not profiled, so LmHead.count == tokens"
)


# ---- the demo --------------------------------------------------------------------------------

def default_threads() -> int:
    """Kernel threads for a timed decode: half the CPUs this process may run on, at least 1 and
    at most torch's default. An intra-op parallel region waits for its slowest thread, so with a
    thread on every core one core taken by another process stalls every op (run-to-run times
    then swing with the machine's load); with half of them the decode keeps its pace."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS, Windows)
        cpus = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), cpus // 2))


class _ProgressBar:
    """A one-line bar redrawn with ``\\r``: only where stderr is a terminal (in a log or CI output
    its frames would pile up)."""

    def __init__(self, enabled: bool, phases: int, width: int = 30):
        enabled = enabled and _is_terminal(sys.stderr)
        self.enabled, self.phases, self.width, self.phase, self.label = enabled, phases, width, 0, ""

    def start(self, label: str) -> None:
        self.phase += 1
        self.label = label

    def __call__(self, step: int, total: int, latency_ns: int) -> None:
        if not self.enabled:
            return
        filled = self.width * step // total
        sys.stderr.write(f"\r[{self.phase}/{self.phases}] {self.label:<14} "
                         f"[{'#' * filled}{'.' * (self.width - filled)}] {step}/{total} tokens "
                         f"{latency_ns / 1e6:7.3f} ms/token")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def run_demo(config: Optional[DecodeConfig] = None, device: Union[str, torch.device] = "brick:0",
             sync_mode: str = "event", runs: int = 5, out_dir: Union[str, os.PathLike] = ".",
             legacy: bool = False, progress: bool = True, legacy_rows: int = 15,
             compile: bool = False, ops: str = "dispatcher",
             device_timing: str = "events") -> dict:
    """Builds the model on ``device``, warms up, profiles ``runs`` decodes with the brick
    registry (the last run's report is kept and written to ``out_dir/report.json``), then runs
    one decode under the legacy autograd profiler for ``out_dir/trace.json`` and its
    ``key_averages()`` table. ``legacy=True`` adds the registry-vs-key_averages comparison.
    ``compile=True`` compiles the forward with torch.compile, each block still a brick (see
    :class:`QwenStyleDecoder`); the warm-up decode compiles, so no profiled run does.
    ``ops="kernels"`` times ops at brick's kernels (``profile(ops="kernels")``): the profiled
    runs cost less; the blocks, the contract's bricks, are timed alike. ``device_timing``: as
    :class:`torch_brickdev.profiler.profile`'s (``"traced"``: the device's own record of its
    work)."""
    # Every argument is checked before any work (no model built, no folder created).
    where = "run_demo()"
    config = _check_config(DecodeConfig() if config is None else config, where)
    if isinstance(runs, bool) or not isinstance(runs, int):
        raise TypeError(f"decode demo: {where}: runs must be a positive integer, got {describe(runs)}")
    if runs < 1:
        raise ValueError(f"decode demo: {where}: runs must be a positive integer, got {runs!r}")
    mode = bp.SyncMode.parse(sync_mode, arg="sync_mode", where=f"decode demo: {where}")
    device = _check_device(device, where)
    if device.type != "brick":
        raise ValueError(
            f"decode demo: {where}: device must be a brick device such as brick:0, got {device}")
    if device.index is None:
        device = torch.device("brick", torch.brick.current_device())
    out_dir = check_path(out_dir, "out_dir", f"decode demo: {where}")
    check_bool(legacy, "legacy", f"decode demo: {where}")
    check_bool(progress, "progress", f"decode demo: {where}")
    check_bool(compile, "compile", f"decode demo: {where}")
    if legacy_refused(check_ops(ops, f"decode demo: {where}"), legacy):
        raise ValueError(f"decode demo: {where}: legacy=True {LEGACY_NEEDS_DISPATCHER}: use "
                         f"ops='dispatcher'")
    if device_timing not in DEVICE_TIMINGS:
        raise ValueError(f"decode demo: {where}: device_timing must be 'events' or 'traced', "
                         f"got {describe_value(device_timing)}")
    # As key_averages().table(row_limit=...): a positive count, or <= 0 for every row.
    check_int(legacy_rows, "legacy_rows", f"decode demo: {where}")
    os.makedirs(out_dir, exist_ok=True)

    bar = _ProgressBar(progress, phases=runs + 2)
    try:
        model = build_model(config, device, compile)
        bar.start("warm-up (compiles)" if compile else "warm-up")
        _decode(model, config, device, progress=bar)
        run_means, run_medians, run_denied, prof, result = [], [], [], None, None
        for r in range(runs):
            bar.start(f"run {r + 1}/{runs}")
            prof = bp.profile(sync_mode=mode, ops=ops, device_timing=device_timing)
            result = _decode(model, config, device, region=prof, progress=bar)
            run_means.append(result.mean_token_ns)
            run_medians.append(result.median_token_ns)
            run_denied.append(prof.report.machine["denied_share"])
        bar.start("legacy trace")
        legacy_prof = torch.autograd.profiler.profile(use_device="brick")
        legacy_result = _decode(model, config, device, region=QuietProfile(legacy_prof),
                                progress=bar)
    finally:
        bar.close()

    lat = result.token_latencies_ns
    figures = {
        "token_latencies_ns": list(lat),
        "run_mean_token_ns": run_means,
        "run_median_token_ns": run_medians,  # what the stability check compares
        # the share of each run its thread waited for a CPU: a busy machine, not a slow decode
        "run_denied_share": run_denied,
        "tokens_per_s": 1e9 * len(lat) / sum(lat),
        "p50_token_ns": _percentile(lat, 50),
        "p99_token_ns": _percentile(lat, 99),
        "threads": torch.get_num_threads(),  # the kernels' (see default_threads)
    }
    report = prof.report.with_metadata(decode={
        "model": "qwen-style", "layers": config.layers, "hidden": config.hidden,
        "heads": config.heads, "kv_heads": config.kv_heads, "vocab": config.vocab,
        "intermediate": config.intermediate_size, "prompt_tokens": config.prompt_tokens,
        "tokens": config.tokens, "runs": runs, "device": str(device), "compiled": compile,
        **figures,
        "final_token": FINAL_TOKEN_NOTE,
    })
    report_path = report.write_json(os.path.join(out_dir, "report.json"))
    trace_path = bp.export_chrome_trace(legacy_prof, os.path.join(out_dir, "trace.json"))
    bp.clear_timeline()
    key_averages = legacy_prof.key_averages().table(sort_by="self_device_time_total",
                                                    row_limit=legacy_rows)
    return {
        "config": config, "device": str(device), "sync_mode": mode.value, "runs": runs,
        "compiled": compile, "report": report, "report_path": report_path, "trace_path": trace_path,
        "brick_table": report.table(),
        "key_averages_table": key_averages,
        "comparison_table": bp.compare_with_key_averages(legacy_prof, report) if legacy else None,
        "tokens": result.tokens, "legacy_tokens": legacy_result.tokens, "prompt": result.prompt,
        **figures,
    }


_SUMMARY_KEYS = ("config", "device", "runs", "sync_mode", "brick_table", "key_averages_table",
                 "run_mean_token_ns", "tokens_per_s", "p50_token_ns", "p99_token_ns",
                 "report_path", "trace_path")


def format_summary(result: dict) -> str:
    """The text summary of a :func:`run_demo` result."""
    where = "decode demo: format_summary()"
    if not isinstance(result, dict):
        raise TypeError(f"{where}: result must be the dict run_demo() returns, got {describe(result)}")
    missing = [key for key in _SUMMARY_KEYS if key not in result]
    if missing:
        raise ValueError(f"{where}: result must be the dict run_demo() returns; it lacks "
                         f"{', '.join(missing)} (got keys: {', '.join(map(str, result)) or 'none'})")
    if not isinstance(result["config"], DecodeConfig):
        raise TypeError(f"{where}: result['config'] must be a DecodeConfig, "
                        f"got {describe(result['config'])}")
    c = result["config"]
    lines = [
        f"Qwen-style decoder on {result['device']}: {c.layers} layers, hidden {c.hidden}, "
        f"{c.heads} heads / {c.kv_heads} KV heads, vocab {c.vocab}, intermediate {c.intermediate_size}; "
        f"prompt {c.prompt_tokens} tokens (prefill not profiled), {c.tokens} decode steps x "
        f"{result['runs']} profiled runs, sync mode {result['sync_mode']}"
        + (", compiled (torch.compile, Inductor), each block still a brick"
           if result.get("compiled") else "")
        + (f", {result['threads']} kernel thread(s)" if "threads" in result else ""),
        "",
        "brick registry (last run):",
        result["brick_table"],
        "",
        "legacy profiler key_averages() (one decode, top rows):",
        result["key_averages_table"],
    ]
    if result.get("comparison_table"):
        lines += ["", "legacy key_averages vs brick registry:", result["comparison_table"]]
    means = ", ".join(f"{m / 1e6:.3f}" for m in result["run_mean_token_ns"])
    if result.get("run_median_token_ns"):
        means += "; median per run (ms): " + ", ".join(
            f"{m / 1e6:.3f}" for m in result["run_median_token_ns"])
    lines += [
        "",
        f"tokens/s: {result['tokens_per_s']:.1f}; per-token latency p50 {result['p50_token_ns'] / 1e6:.3f} ms, "
        f"p99 {result['p99_token_ns'] / 1e6:.3f} ms; mean per run (ms): {means}",
        f"report: {result['report_path']}",
        f"trace:  {result['trace_path']}",
    ]
    return "\n".join(lines)
