"""What live publishing costs per snapshot, for a registry of ~135 bricks with histograms.

Inside one profile, 130 record_function ranges around brick ops (plus the ops' own bricks) are
called with varied sizes so each histogram holds several buckets. Then, each ``--repeats`` times
(CPU time of this thread, the publishing thread's own measure; figures are medians):

* the registry snapshot with histograms (``_C._profiler.snapshot``),
* the snapshot encoded by ``json.dump`` into a file (the pure-Python encoder) and by
  ``json.dumps`` then one write (the C encoder),
* ``Publisher.publish()`` whole (snapshot, encoding, temporary file, rename),

and the share of the process's time that one snapshot per 0.5 s (the default interval) takes.

Run: python benchmarks/bench_live.py [--repeats N] [--ranges N]
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from torch.profiler import record_function

import torch_brickdev  # noqa: F401
from torch_brickdev import _C
from torch_brickdev import profiler as bp
from torch_brickdev.profiler import live


def cpu_ms(work, repeats: int) -> float:
    """The median CPU time of ``work()`` in ms."""
    times = []
    for _ in range(repeats):
        begin = time.thread_time_ns()
        work()
        times.append(time.thread_time_ns() - begin)
    return statistics.median(times) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--ranges", type=int, default=130)
    args = parser.parse_args()
    torch.set_num_threads(1)
    xs = [torch.randn(n, device="brick") for n in (8, 256, 4096, 65536)]
    with tempfile.TemporaryDirectory() as directory:
        os.environ["BRICK_LIVE_DIR"] = os.path.join(directory, "live")
        with bp.profile():
            for x in xs:
                for i in range(args.ranges):
                    with record_function(f"block{i}"):
                        x + 1
            data = {"format": live.FORMAT, "version": live.VERSION,
                    "bricks": _C._profiler.snapshot(["name"], histograms=True)["name"]}
            bricks = len(data["bricks"])
            path = os.path.join(directory, "snapshot.json")

            def snapshot():
                _C._profiler.snapshot(["name"], histograms=True)

            def dump_to_file():
                with open(path, "w") as f:
                    json.dump(data, f, separators=(",", ":"))

            def dumps_then_write():
                payload = json.dumps(data, separators=(",", ":")).encode()
                with open(path, "wb") as f:
                    f.write(payload)

            publisher = live.Publisher(interval=3600)  # publishes when asked only
            publisher.start()
            try:
                figures = {"snapshot": cpu_ms(snapshot, args.repeats),
                           "json.dump to a file": cpu_ms(dump_to_file, args.repeats),
                           "json.dumps + one write": cpu_ms(dumps_then_write, args.repeats),
                           "Publisher.publish()": cpu_ms(publisher.publish, args.repeats)}
                size = os.path.getsize(publisher.path)
            finally:
                publisher.stop()
    print(f"{bricks} bricks, a snapshot of {size / 1024:.0f} KiB; median CPU ms of "
          f"{args.repeats} repeats")
    for what, ms in figures.items():
        print(f"  {what:<24} {ms:8.3f} ms")
    share = figures["Publisher.publish()"] / (live.MIN_INTERVAL_S * 1e3)
    print(f"one snapshot per {live.MIN_INTERVAL_S} s: {100 * share:.2f} % of the process's time")


if __name__ == "__main__":
    main()
