"""The heads_first experiments (decisions 069, 070) against the default grid,
in one process, kernels alone (CUDA-graph replays): packed documents of
~1,000 tokens (or another spec body reading inputs), B = 1, H = 16, bf16.
`--knob heads_first` times the forward, `--knob bwd_heads_first` the
backward (`backward()` given the forward's o and log-sum-exp; its plan built
in each call).

    python3 scripts/gpu_heads_first.py [--knob heads_first] [--head-dim 64] \
        [--seqlens 16384 65536] [--body TEXT]
"""

import argparse
import sys

import torch
import triton.testing

sys.path.insert(0, ".")
from flashgen.api import _check_specs, load_variant  # noqa: E402
from flashgen.experiments import parse_settings  # noqa: E402
from flashgen.verify import Shape, random_runtime_inputs  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--head-dim", type=int, nargs="+", default=[64])
parser.add_argument("--seqlens", type=int, nargs="+", default=[16384, 65536])
parser.add_argument("--knob", choices=["heads_first", "bwd_heads_first"], default="heads_first")
parser.add_argument("--body", default="doc: int32[B, Nk]; mask = causal & doc[b, q] == doc[b, k]")
args = parser.parse_args()
for d in args.head_dim:
    (variant,) = _check_specs(
        [f"attention packed_docs {{ head_dim = {d}; dtype = bf16; {args.body} }}"]
    )
    modules = {
        s: load_variant(variant, parse_settings([f"{args.knob}={s}"])) for s in ("off", "on")
    }
    for n in args.seqlens:
        q, k, v = (torch.randn(1, 16, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        data = random_runtime_inputs(
            variant, Shape(1, 16, 16, n, n), "cuda", generator=torch.Generator().manual_seed(n),
            mean_run=1000,
        )  # fmt: skip
        do = torch.randn_like(q)
        outs, times = {}, {}
        for setting, module in modules.items():
            if args.knob == "heads_first":
                plan = module.tile_plan(q, k, v, **data)
                fn = lambda m=module, p=plan: (m.attention(q, k, v, **data, plan=p),)  # noqa: E731
            else:
                o, lse = module.forward(q, k, v, **data)
                fn = lambda m=module, o=o, lse=lse: m.backward(q, k, v, o, lse, do, **data)  # noqa
            outs[setting] = fn()
            times[setting] = triton.testing.do_bench_cudagraph(fn)
        same = all(torch.equal(a, b) for a, b in zip(outs["off"], outs["on"]))
        print(
            f"d{d} N={n}: {'forward' if args.knob == 'heads_first' else 'backward'} "
            f"{times['off']:.4f} ms default, {times['on']:.4f} ms {args.knob} "
            f"({times['off'] / times['on']:.3f}x), same bits {same}",
            flush=True,
        )
