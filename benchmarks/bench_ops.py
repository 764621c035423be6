"""Per-op time on brick versus the same op on the CPU, same process, same data.

Each case runs both sides interleaved in rounds; the figure is the median per-call time over
rounds, and the ratio is brick / cpu. Targets (from the hot-path issue):
  tiny elementwise ops (<= 1k elements), and a decoding
  loop's small ops (index_select, isin, argmax, a dtype
  cast, positions, item()):                              brick <= 1.2x cpu
  a transformers decoder's greedy generate() (Qwen2-style,
  small random config, sdpa; skipped without transformers): brick <= 1.1x cpu
  1024x1024 matmul, small MLP forward:                   brick <= 1.05x cpu

Run: python benchmarks/bench_ops.py [--rounds N] [--json out.json]
"""

import argparse
import json
import statistics
import sys
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


def cases():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    ab, bb = a.to("brick"), b.to("brick")
    tiny = [
        ("add (1k)", lambda x, y: x + y),
        ("mul (1k)", lambda x, y: x * y),
        ("relu (1k)", lambda x, y: torch.relu(x)),
        ("add_ in-place (1k)", lambda x, y: x.add_(y, alpha=0.0)),
        ("sigmoid (256)", lambda x, y: torch.sigmoid(x[:256])),
        ("where (1k)", lambda x, y: torch.where(x > 0, x, y)),
    ]
    for name, fn in tiny:
        yield name, "tiny", 1.2, 20000, (lambda fn=fn: fn(a, b)), (lambda fn=fn: fn(ab, bb))
    # A decoding loop's own small ops: token lookup, stopping criteria, the greedy choice.
    table, rows = torch.randn(256, 64, generator=g), torch.tensor([3, 7, 9])
    ids, stop = torch.randint(0, 256, (1, 24), generator=g), torch.tensor([2])
    logits = torch.randn(1, 256, generator=g)
    on_brick = [t.to("brick") for t in (table, rows, ids, stop, logits)]
    decode = [
        ("index_select (3 of 256 rows)", lambda t, r, i, s, l: t.index_select(0, r)),
        ("isin (24 ids)", lambda t, r, i, s, l: torch.isin(i, s)),
        ("argmax (256 logits)", lambda t, r, i, s, l: l.argmax(-1)),
        ("to(float32) (64 bf16)", lambda t, r, i, s, l: l[0, :64].to(torch.bfloat16).float()),
        ("arange (24 positions)", lambda t, r, i, s, l: torch.arange(24, device=l.device)),
        ("item() (1 id)", lambda t, r, i, s, l: r[0].item()),
    ]
    cpu_args = (table, rows, ids, stop, logits)
    for name, fn in decode:
        yield (name, "tiny", 1.2, 20000, (lambda fn=fn: fn(*cpu_args)),
               (lambda fn=fn: fn(*on_brick)))
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="also write the figures to this file")
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    print(f"\n{len(rows) - failed}/{len(rows)} cases within target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
