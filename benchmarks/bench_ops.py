"""Per-op time on brick versus the same op on the CPU, same process, same data.

Each case runs both sides interleaved in rounds; the figure is the median per-call time over
rounds, and the ratio is brick / cpu. Targets (from the hot-path issue):
  tiny elementwise ops (<= 1k elements), and a decoding
  loop's small ops (index_select, isin, argmax, a dtype
  cast, positions, item()):                              brick <= 1.2x cpu
  a transformers decoder's greedy generate() (Qwen2-style,
  small random config, sdpa; skipped without transformers): brick <= 1.1x cpu
  1024x1024 matmul, small MLP forward:                   brick <= 1.05x cpu

Times are noisy on a small shared machine; instruction counts are not. With valgrind installed,
each small op's instructions per call on the CPU and on brick (callgrind, all cases in one
process per run; the loop's own cost subtracted) are printed with what brick adds, so a
regression of the op path shows even where times cannot (--no-instructions skips them).

Run: python benchmarks/bench_ops.py [--rounds N] [--json out.json] [--no-instructions]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import torch_brickdev  # noqa: F401


def time_per_call(fn, calls: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls


def measure(cpu_fn, brick_fn, calls: int, rounds: int):
    for fn in (cpu_fn, brick_fn):  # warm up allocators and caches
        time_per_call(fn, max(1, calls // 10))
    cpu, brick = [], []
    for _ in range(rounds):
        cpu.append(time_per_call(cpu_fn, calls))
        brick.append(time_per_call(brick_fn, calls))
        torch.brick.synchronize()
    return statistics.median(cpu), statistics.median(brick)


# The small ops, as statements over the tensors SMALL_OP_TENSORS makes on a device: timed here
# and counted under callgrind from the same text.
SMALL_OP_TENSORS = """
g = torch.Generator().manual_seed(0)
x, y = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
t, r = torch.randn(256, 64, generator=g), torch.tensor([3, 7, 9])
i, s = torch.randint(0, 256, (1, 24), generator=g), torch.tensor([2])
l = torch.randn(1, 256, generator=g)
x, y, t, r, i, s, l = (v.to(DEVICE) for v in (x, y, t, r, i, s, l))
"""
SMALL_OPS = [
    ("add (1k)", "x + y"),
    ("mul (1k)", "x * y"),
    ("relu (1k)", "torch.relu(x)"),
    ("add_ in-place (1k)", "x.add_(y, alpha=0.0)"),
    ("sigmoid (256)", "torch.sigmoid(x[:256])"),
    ("where (1k)", "torch.where(x > 0, x, y)"),
    # A decoding loop's own small ops: token lookup, stopping criteria, the greedy choice.
    ("index_select (3 of 256 rows)", "t.index_select(0, r)"),
    ("isin (24 ids)", "torch.isin(i, s)"),
    ("argmax (256 logits)", "l.argmax(-1)"),
    ("to(float32) (64 bf16)", "l[0, :64].to(torch.bfloat16).float()"),
    ("arange (24 positions)", "torch.arange(24, device=l.device)"),
    ("item() (1 id)", "r[0].item()"),
]


def small_op_namespace(device: str) -> dict:
    namespace = {"torch": torch, "DEVICE": device}
    exec(SMALL_OP_TENSORS, namespace)
    return namespace


def statement(code: str, namespace: dict):
    return eval(f"lambda: {code}", namespace)


def cases():
    on_cpu, on_brick = small_op_namespace("cpu"), small_op_namespace("brick")
    for name, code in SMALL_OPS:
        yield (name, "tiny", 1.2, 20000, statement(code, on_cpu), statement(code, on_brick))
    g = torch.Generator().manual_seed(1)
    m = torch.randn(1024, 1024, generator=g)
    mb = m.to("brick")
    yield "matmul 1024x1024", "large", 1.05, 5, (lambda: m @ m), (lambda: mb @ mb)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512), torch.nn.LayerNorm(512)
    ).eval()
    import copy

    mlp_b = copy.deepcopy(mlp).to("brick")
    x = torch.randn(64, 512, generator=g)
    xb = x.to("brick")
    with torch.no_grad():
        yield "MLP forward 64x512->2048->512", "large", 1.05, 50, (lambda: mlp(x)), (lambda: mlp_b(xb))
    generate = qwen2_generate_case()
    if generate is not None:
        yield generate


def qwen2_generate_case():
    """Greedy generate() of a small random Qwen2 (2 layers, hidden 64): 16 new tokens."""
    try:
        import transformers
    except ImportError:
        print("(generate() case skipped: transformers is not installed)")
        return None
    transformers.logging.set_verbosity_error()
    config = transformers.Qwen2Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, attn_implementation="sdpa")
    torch.manual_seed(0)
    import copy

    model = transformers.Qwen2ForCausalLM(config).eval()
    model_b = copy.deepcopy(model).to("brick")
    ids = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(0))
    ids_b = ids.to("brick")

    def generate(m, inputs):
        return m.generate(input_ids=inputs, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                          num_beams=1)

    return ("Qwen2 generate() 16 tokens", "model", 1.1, 3, (lambda: generate(model, ids)),
            (lambda: generate(model_b, ids_b)))


# Run under callgrind with collection off: each statement's calls are collected between two
# client requests, one dump each, in the order the parent reads them back.
_CALLGRIND_DRIVER = """
import gc
import sys
sys.path.insert(0, sys.argv[1])
import torch
from bench_ops import SMALL_OPS, small_op_namespace, statement
calls, REPEATS = int(sys.argv[2]), int(sys.argv[3])
gc.disable()  # a collection inside a counted loop would count too
for device in ("cpu", "brick"):
    namespace = small_op_namespace(device)
    for code in ["None"] + [code for _, code in SMALL_OPS]:  # "None": the loop's own cost
        fn = statement(code, namespace)
        for _ in range(200):
            fn()
        for _ in range(REPEATS):
            torch._C._valgrind_toggle()
            for _ in range(calls):
                fn()
            torch._C._valgrind_toggle_and_dump_stats()
"""


def small_op_instructions(calls: int = 500, repeats: int = 5):
    """{case: (cpu, brick)} instructions per call of each small op (the median of `repeats`
    counts; a fresh result's allocation costs more or less with the heap's state), or None
    without valgrind."""
    if shutil.which("valgrind") is None or not torch._C._valgrind_supported_platform():
        return None
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    statements = len(SMALL_OPS) + 1  # the loop's own cost first
    with tempfile.TemporaryDirectory() as out:
        command = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
                   f"--callgrind-out-file={out}/cg.out", sys.executable, "-c", _CALLGRIND_DRIVER,
                   bench_dir, str(calls), str(repeats)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind run failed ({done.returncode}): {done.stderr[-2000:]}")
        totals = []
        for dump in range(1, 2 * statements * repeats + 1):
            with open(f"{out}/cg.out.{dump}") as f:
                totals.append(next(int(line.split()[1]) for line in f
                                   if line.startswith(("totals:", "summary:"))))
    medians = [statistics.median(totals[k * repeats:(k + 1) * repeats]) / calls
               for k in range(2 * statements)]
    cpu, brick = medians[:statements], medians[statements:]
    return {name: (cpu[k + 1] - cpu[0], brick[k + 1] - brick[0])
            for k, (name, _) in enumerate(SMALL_OPS)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--no-instructions", action="store_true",
                        help="skip the small ops' instruction counts (callgrind, ~1 minute)")
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, brick runtime "
          f"{torch_brickdev.runtime_name()}; median of {args.rounds} interleaved rounds\n")
    print(f"{'case':<32} {'cpu us':>10} {'brick us':>10} {'ratio':>7} {'target':>7}  verdict")
    rows, failed = [], 0
    with torch.no_grad():
        for name, kind, target, calls, cpu_fn, brick_fn in cases():
            cpu_ns, brick_ns = measure(cpu_fn, brick_fn, calls, args.rounds)
            ratio = brick_ns / cpu_ns
            ok = ratio <= target
            failed += not ok
            rows.append(dict(case=name, kind=kind, cpu_us=cpu_ns / 1e3, brick_us=brick_ns / 1e3,
                             ratio=ratio, target=target, ok=ok))
            print(f"{name:<32} {cpu_ns / 1e3:>10.2f} {brick_ns / 1e3:>10.2f} {ratio:>6.2f}x "
                  f"{target:>6.2f}x  {'ok' if ok else 'OVER TARGET'}")
    print(f"\n{len(rows) - failed}/{len(rows)} cases within target")
    counts = None if args.no_instructions else small_op_instructions()
    if counts is None and not args.no_instructions:
        print("\n(instruction counts skipped: valgrind is not installed)")
    elif counts is not None:
        print("\ninstructions per call (callgrind: independent of load; ops that allocate vary by "
              "a few hundred with the heap's state)")
        print(f"{'case':<32} {'cpu':>10} {'brick':>10} {'brick adds':>11}")
        for row in rows:
            if row["case"] in counts:
                cpu, brick = counts[row["case"]]
                row.update(cpu_instructions=cpu, brick_instructions=brick)
                print(f"{row['case']:<32} {cpu:>10.0f} {brick:>10.0f} {brick - cpu:>11.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
