"""Packed documents three ways, side by side on one GPU, same documents:

* flashgen varlen: a causal spec called with the batch's sequences, made once
  (`sequences(cu_seqlens_q=..., cu_seqlens_k=...)`), q (T, H, D); and called
  with cu_seqlens_q/k and max_seqlen_q/k, which checks them at every call
  (under a CUDA graph's capture: reads nothing on the host, decision 105);
* flashgen packed_docs: `causal & doc[b, q] == doc[b, k]`, B = 1, N = T, the
  document ids an input (the per-call tile plan skips cross-document tiles);
  and built with `document_runs=on` (decision 109: the plan's runs on the
  causal mask's Gluon kernels), on q, k, v with rows of tokens and contiguous,
  with tile_plan's wall time either way;
* FlexAttention: the same document mask as a mask_mod, compiled afresh for
  each case (dynamic=False, as `flashgen bench` compiles it), its block mask
  built outside the timed region;

and, for the question "what does the runtime data cost", the same causal
module on dense batches of equal-length documents (B = T / L, N = L).

Document lengths are drawn uniformly from [1, 2 * mean - 1] (mean `mean`)
until they fill T tokens (the last one cut).  FLOPs count visible pairs only:
4 * D * H * sum(L (L + 1) / 2) forward, 2.5 times that backward, whose time
is (forward + backward) - forward; medians of triton.testing.do_bench, or
with `--timer cuda-graph` of CUDA-graph replays (the kernels alone).  The
packed_docs module takes a tile plan built once per case, outside the timed
region, as FlexAttention's block mask is.

With --plan, the varlen calls (with `sequences=` and with cu_seqlens) are
timed a second time on the causal module built with those plan knobs
(`flashgen bench --plan`), beside the first.

    python3 scripts/gpu_varlen_bench.py [--tokens 16384 65536] [--head-dim 64 128]
        [--mean 1000] [--jsonl PATH] [--run NAME] [--commit SHA] [--timer cuda-graph]
        [--plan KNOB=VALUE ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
import triton
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashgen import api, experiments  # noqa: E402

HEADS = 16


def documents(total: int, mean: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    lengths = []
    while sum(lengths) < total:
        lengths.append(min(rng.randint(1, 2 * mean - 1), total - sum(lengths)))
    return lengths


def spec(name: str, head_dim: int, body: str) -> str:
    return f"attention {name} {{ head_dim = {head_dim}; dtype = bf16; {body} }}"


def timed(fn, q, k, v, do, timer):
    """(forward ms, forward + backward ms, the timer that took them): medians of
    do_bench, or of CUDA-graph replays (`timer` "cuda-graph"), the kernels
    alone; a call that cannot be captured (one that reads a tensor back to
    the host) is timed with do_bench."""
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]

    def both():
        o = fn(*inputs)
        torch.autograd.grad(o, inputs, do)

    def forward():
        with torch.no_grad():
            fn(q, k, v)

    if timer == "cuda-graph":
        try:
            bench = triton.testing.do_bench_cudagraph
            return bench(forward, return_mode="median"), bench(both, return_mode="median"), timer
        except RuntimeError as e:  # torch's capture errors are RuntimeErrors
            print(f"  not captured ({str(e).splitlines()[0][:80]}): do_bench", flush=True)
            torch.cuda.synchronize()
    bench = triton.testing.do_bench
    fwd = bench(forward, warmup=50, rep=200, return_mode="median")
    return fwd, bench(both, warmup=50, rep=200, return_mode="median"), "do_bench"


def read_runs(plan) -> None:
    """What a first call reads of a plan's runs (decision 110), if it has any."""
    if getattr(plan, "runs", None) is not None:
        plan.runs.backward


def plan_device_ms(build) -> float:
    """Median GPU time of `build()`'s launches (no read on the host) queued
    behind a matrix product that keeps the GPU busy while the host queues
    them, in ms: what a plan costs a step whose host runs ahead."""
    busy = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(15):
        torch.cuda.synchronize()
        busy @ busy
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        build()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def plan_ms(build) -> float:
    """Median wall time of `build()` (a tile plan, which may read the GPU back
    on the host), from a synchronized GPU, in ms."""
    times = []
    for _ in range(25):
        torch.cuda.synchronize()
        start = time.perf_counter()
        build()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument("--head-dim", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--mean", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jsonl")
    parser.add_argument("--run", default="varlen")
    parser.add_argument("--commit")
    parser.add_argument("--timer", choices=["do_bench", "cuda-graph"], default="do_bench")
    parser.add_argument(
        "--plan",
        nargs="+",
        action="extend",
        default=[],
        metavar="KNOB=VALUE",
        help="also time the varlen call on the causal module built with these plan knobs",
    )
    args = parser.parse_args()
    knobs = experiments.parse_settings(args.plan)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    commit = (
        args.commit
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    context = dict(
        commit=commit,
        date=datetime.date.today().isoformat(),
        run=args.run,
        gpu=torch.cuda.get_device_name(),
        triton=triton.__version__,
        torch=torch.__version__,
        command="python3 scripts/gpu_varlen_bench.py " + " ".join(sys.argv[1:]),
    )
    records = []
    print(
        f"{'D':>4} {'tokens':>6} {'system':<28} {'fwd ms':>8} {'TFLOP/s':>8} {'bwd ms':>8} {'TFLOP/s':>8}"
    )
    for head_dim in args.head_dim:
        (variant,) = api.check_sources({"causal": spec("causal", head_dim, "mask = causal")})[0]
        causal = api.load_variant(variant)
        knobbed = api.load_variant(variant, knobs) if knobs else None
        docs_text = spec(
            "packed_docs", head_dim, "doc: int32[B, Nk]; mask = causal & doc[b, q] == doc[b, k]"
        )
        # Decision 109: with document_runs=on, calls whose ids form runs take the
        # causal mask's Gluon kernels over the runs; off, the module's own kernels.
        (docs_variant,) = api.check_sources({"docs": docs_text})[0]
        docs_mod = api.load_variant(docs_variant, {"document_runs": True})
        docs_off = api.load_variant(docs_variant, {"document_runs": False})
        for total in args.tokens:
            lengths = documents(total, args.mean, args.seed)
            pairs = sum(n * (n + 1) // 2 for n in lengths)
            flops = 4 * head_dim * HEADS * pairs
            g = torch.Generator(device="cuda").manual_seed(0)

            def rand(*shape):
                return torch.randn(*shape, generator=g, device="cuda", dtype=torch.bfloat16)

            q3, k3, v3, do3 = (rand(total, HEADS, head_dim) for _ in range(4))
            cu = torch.tensor([0] + [sum(lengths[: i + 1]) for i in range(len(lengths))])
            cu = cu.to(device="cuda", dtype=torch.int32)
            most = max(lengths)
            doc = torch.repeat_interleave(
                torch.arange(len(lengths), device="cuda", dtype=torch.int32),
                torch.tensor(lengths, device="cuda"),
            )
            q4, k4, v4, do4 = (x.transpose(0, 1)[None] for x in (q3, k3, v3, do3))

            def doc_mask(b, h, q, k):
                return (q >= k) & (doc[q] == doc[k])

            block_mask = create_block_mask(doc_mask, 1, None, total, total, device="cuda")
            # A fresh compilation per case, for its shapes: one compiled function
            # called at several shapes recompiles with dynamic shapes (the
            # records of 2026-12-02 and 2026-12-04, decision 069).
            torch._dynamo.reset()
            flex = torch.compile(flex_attention, dynamic=False)
            dense_len = args.mean
            dense_b = total // dense_len
            dense = [rand(dense_b, HEADS, dense_len, head_dim) for _ in range(4)]
            dense_flops = 4 * head_dim * HEADS * dense_b * dense_len * (dense_len + 1) // 2
            once = causal.sequences(cu_seqlens_q=cu, cu_seqlens_k=cu)  # checked once per batch
            knobbed_once = knobbed and knobbed.sequences(cu_seqlens_q=cu, cu_seqlens_k=cu)
            # built once per batch, as the block mask is
            doc2 = doc[None]  # the tensor the plan was built for, at every call
            plan = docs_mod.tile_plan(q4, k4, v4, doc=doc2)
            plan_off = docs_off.tile_plan(q4, k4, v4, doc=doc2)
            # The same module on (B, H, N, D) contiguous tensors (the runs' other layout).
            q4c, k4c, v4c, do4c = (x.contiguous() for x in (q4, k4, v4, do4))
            plan_c = docs_mod.tile_plan(q4c, k4c, v4c, doc=doc2)
            for name, module in (("document_runs=on", docs_mod), ("document_runs=off", docs_off)):
                cost = plan_ms(lambda: read_runs(module.tile_plan(q4, k4, v4, doc=doc2)))
                device = plan_device_ms(lambda: module.tile_plan(q4, k4, v4, doc=doc2))
                print(f"{head_dim:>4} {total:>6} tile_plan, {name:<17} {cost:8.3f} ms, on the GPU {device:.3f} ms", flush=True)  # fmt: skip
                records.append(dict(context, spec=f"tile_plan, {name}", tokens=total, D=head_dim, ms=cost, device_ms=device))  # fmt: skip
            systems = [
                ("flashgen varlen", lambda a, b, c: causal.attention(
                    a, b, c, sequences=once), (q3, k3, v3, do3), flops),
                ("flashgen varlen, cu_seqlens", lambda a, b, c: causal.attention(
                    a, b, c, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=most,
                    max_seqlen_k=most), (q3, k3, v3, do3), flops),
                ("flashgen packed_docs, document_runs=on", lambda a, b, c: docs_mod.attention(
                    a, b, c, doc=doc2, plan=plan), (q4, k4, v4, do4), flops),
                ("flashgen packed_docs, document_runs=on, (B, H, N, D)", lambda a, b, c: docs_mod.attention(
                    a, b, c, doc=doc2, plan=plan_c), (q4c, k4c, v4c, do4c), flops),
                ("flashgen packed_docs", lambda a, b, c: docs_off.attention(
                    a, b, c, doc=doc2, plan=plan_off), (q4, k4, v4, do4), flops),
                ("flex", lambda a, b, c: flex(a, b, c, block_mask=block_mask),
                 (q4, k4, v4, do4), flops),
                (f"flashgen dense B{dense_b} N{dense_len}", causal.attention, dense, dense_flops),
            ]  # fmt: skip
            if knobbed:
                systems[1:1] = [
                    (f"flashgen varlen, {' '.join(args.plan)}", lambda a, b, c: knobbed.attention(
                        a, b, c, sequences=knobbed_once), (q3, k3, v3, do3), flops),
                    (f"flashgen varlen, cu_seqlens, {' '.join(args.plan)}", lambda a, b, c: knobbed.attention(
                        a, b, c, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=most,
                        max_seqlen_k=most), (q3, k3, v3, do3), flops),
                ]  # fmt: skip
            reference = None
            for name, fn, (a, b, c, do), work in systems:
                fwd, both, timer = timed(fn, a, b, c, do, args.timer)
                bwd = both - fwd
                diff = None
                if not name.startswith("flashgen dense"):
                    with torch.no_grad():
                        out = fn(a, b, c)
                    out = out if out.dim() == 3 else out[0].transpose(0, 1)
                    if reference is None:
                        reference = out.float()
                    diff = (out.float() - reference).abs().max().item()
                tf, btf = work / fwd / 1e9, 2.5 * work / bwd / 1e9
                print(
                    f"{head_dim:>4} {total:>6} {name:<28} {fwd:8.3f} {tf:8.1f} {bwd:8.3f} {btf:8.1f}"
                    f"  max|o - varlen| {diff}", flush=True,
                )  # fmt: skip
                base = dict(
                    context, spec=name, documents=len(lengths), mean_length=args.mean,
                    tokens=total, H=HEADS, Hkv=HEADS, D=head_dim, dtype="bf16",
                    density=pairs / total**2 if "dense" not in name else None, timer=timer,
                )  # fmt: skip
                records.append(dict(base, direction="fwd", ms=fwd, tflops=tf, max_diff=diff))
                records.append(dict(base, direction="fwd+bwd", ms=both, bwd_ms=bwd, bwd_tflops=btf))
    if args.jsonl:
        with open(args.jsonl, "a", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
