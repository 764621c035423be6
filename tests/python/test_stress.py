"""Smaller runs of the reliability stress benchmarks (benchmarks/stress_*.py), as tests.

* Concurrency: 8 threads of brick ops in nested record_function ranges while another thread
  snapshots and resets; every call is either in stats() or counted by
  health()["discarded_by_reset"], exactly, and nothing deadlocks.
* Memory: profiled ops in event mode; after a warm-up neither RSS nor the profiler's device
  events grow.
"""

from __future__ import annotations

import pytest

from profiler_helpers import clean_profiler, load_benchmark  # noqa: F401  (a fixture)


@pytest.fixture(autouse=True)
def _clean(clean_profiler):  # noqa: F811
    yield


def test_concurrent_resets_account_for_every_call():
    stress = load_benchmark("stress_concurrency")
    threads, ops = 8, 5000
    r = stress.run(threads=threads, ops=ops, timeout_s=60)
    assert not r["stuck"], f"deadlocked: {r['stuck']} still running after 60 s"
    assert not r["errors"], r["errors"]  # includes new timing failures or unbalanced exits
    assert not r["violations"], r["violations"][:10]
    assert r["ops"] == threads * ops
    assert r["calls"] == r["expected_calls"]
    assert r["resets"] >= 1 and r["snapshots"] >= r["resets"]
    assert r["recorded"] + r["discarded"] == r["calls"], (
        f"recorded {r['recorded']} + discarded {r['discarded']} != calls made {r['calls']}")
    assert r["exact"]
    assert r["health"]["timing_failures"] == 0
    assert r["health"]["unbalanced_exits"] == 0


def test_profiled_ops_keep_memory_and_events_bounded():
    stress = load_benchmark("stress_memory")
    r = stress.run(ops=200_000, sample_every=20_000, warmup=40_000)
    assert r["all_ops_recorded"]
    assert r["live_events_growth_after_warmup"] <= 0, [s["live_events"] for s in r["samples"]]
    rss_mib = [round(s["rss"] / stress.MIB, 1) for s in r["samples"]]
    assert r["rss_growth_after_warmup"] < 8 * stress.MIB, rss_mib
    bricks = {s["bricks"] for s in r["samples"][1:]}
    assert bricks == {2}, bricks  # the range and the op, however many calls
