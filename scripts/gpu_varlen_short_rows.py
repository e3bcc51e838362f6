"""Varlen calls with short sequences: the backward at the module's
GPU_BWD_CONFIG against the short-rows tiles of `launch.gpu_bwd_config`
(decision 070: slower for every varlen call measured, so not taken),
in one process, kernels alone (CUDA-graph replays of forward + backward;
the backward's time is the difference from the forward's), bf16, H = 16.

Sequences: documents of uniform length in [1, 2 * mean - 1] (mean 1000, as
scripts/gpu_varlen_bench.py draws them), or all of one length (`--fixed`).

    python3 scripts/gpu_varlen_short_rows.py [--head-dim 128] [--tokens 16384 65536] \
        [--masks causal full] [--fixed 2048 4096]
"""

import argparse
import random
import sys

import torch
import triton.testing

sys.path.insert(0, ".")
from flashgen import api, ir  # noqa: E402
from flashgen.launch import gpu_bwd_config  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--head-dim", type=int, nargs="+", default=[128])
parser.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536])
parser.add_argument("--masks", nargs="+", default=["causal", "full"])
parser.add_argument("--fixed", type=int, nargs="*", default=[2048, 4096])
args = parser.parse_args()


def lengths_of(total: int, fixed: int | None) -> list[int]:
    if fixed:
        return [fixed] * (total // fixed)
    rng, out = random.Random(0), []
    while sum(out) < total:
        out.append(min(rng.randint(1, 1999), total - sum(out)))
    return out


for d in args.head_dim:
    for mask in args.masks:
        module = api.load(f"attention m {{ head_dim = {d}; dtype = bf16; mask = {mask} }}")
        default = module._launch_config
        short = gpu_bwd_config(d, ir.DType.BF16, short_rows=True)
        configs = {
            "long": module.GPU_BWD_CONFIG,
            "short": (short.block_m, short.block_n, short.num_warps, short.num_stages),
        }
        for total in args.tokens:
            for fixed in [None, *args.fixed]:
                lengths = lengths_of(total, fixed)
                tokens = sum(lengths)
                cu = torch.tensor([0] + [sum(lengths[: i + 1]) for i in range(len(lengths))])
                seqs = module.sequences(cu_seqlens_q=cu.cuda().int(), cu_seqlens_k=cu.cuda().int())
                q, k, v, do = (
                    torch.randn(tokens, 16, d, device="cuda", dtype=torch.bfloat16)
                    for _ in range(4)
                )
                leaves = [x.clone().requires_grad_() for x in (q, k, v)]
                times, grads = {}, {}
                for name in ("long", "short"):

                    def config(device, backward=False, seqs=None, name=name):
                        return configs[name] if backward else default(device)

                    module._launch_config = config

                    def both():
                        o = module.attention(*leaves, sequences=seqs)
                        return torch.autograd.grad(o, leaves, do)

                    def forward():
                        with torch.no_grad():
                            module.attention(q, k, v, sequences=seqs)

                    grads[name] = both()
                    fwd = triton.testing.do_bench_cudagraph(forward, return_mode="median")
                    times[name] = (
                        triton.testing.do_bench_cudagraph(both, return_mode="median") - fwd
                    )
                module._launch_config = default
                diff = max(
                    (a.float() - b.float()).abs().max().item() for a, b in zip(*grads.values())
                )
                what = f"all {fixed}" if fixed else "uniform [1, 1999]"
                print(
                    f"d{d} {mask:<6} T={total} sequences {what}: backward {times['long']:.4f} ms "
                    f"at {configs['long']}, {times['short']:.4f} ms at {configs['short']} "
                    f"({times['long'] / times['short']:.3f}x), max |grad diff| {diff:.3g}",
                    flush=True,
                )
