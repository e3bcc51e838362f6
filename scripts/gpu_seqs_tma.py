"""The seqs_tma experiment (decision 072): the backward of padded and varlen
calls through TMA descriptors against pointer loads, in one process, kernels
alone (CUDA-graph replays; the backward's time is forward + backward less
forward), bf16, H = 16, the causal module built with and without the knob.

Cases: varlen documents of uniform length in [1, 2 * mean - 1] (mean 1000,
as scripts/gpu_varlen_bench.py draws them) at each --tokens; a right-padded
batch of 8 rows of N = 2048 with lengths uniform in [1, 2048]; and a dense
call (B = 4, N = 4096), which takes TMA either way and shows what the
knob's zeroing of rows past a sequence costs where there is none.  The
gradients of the two modules must be the same bits.

    python3 scripts/gpu_seqs_tma.py [--head-dim 128 64] [--tokens 16384 65536]
"""

import argparse
import random
import sys

import torch
import triton.testing

sys.path.insert(0, ".")
from flashgen.api import _check_specs, load_variant  # noqa: E402
from flashgen.experiments import parse_settings  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--head-dim", type=int, nargs="+", default=[128, 64])
parser.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536])
parser.add_argument("--mask", default="causal")
args = parser.parse_args()


def rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def cases(d: int):
    rng = random.Random(0)
    for total in args.tokens:
        lengths = []
        while sum(lengths) < total:
            lengths.append(min(rng.randint(1, 1999), total - sum(lengths)))
        cu = torch.tensor([0] + [sum(lengths[: i + 1]) for i in range(len(lengths))])
        cu = cu.to(device="cuda", dtype=torch.int32)
        yield f"varlen T={total}", [rand(total, 16, d) for _ in "qkvo"], dict(
            cu_seqlens_q=cu, cu_seqlens_k=cu
        )
    seqlens = torch.tensor([rng.randint(1, 2048) for _ in range(8)], device="cuda")
    yield "padded 8 x 2048", [rand(8, 16, 2048, d) for _ in "qkvo"], dict(
        seqlens_q=seqlens, seqlens_k=seqlens
    )
    yield "dense 4 x 4096", [rand(4, 16, 4096, d) for _ in "qkvo"], {}


for d in args.head_dim:
    (variant,) = _check_specs(
        [f"attention m {{ head_dim = {d}; dtype = bf16; mask = {args.mask} }}"]
    )
    modules = {s: load_variant(variant, parse_settings(k)) for s, k in
               (("pointers", []), ("seqs_tma", ["seqs_tma=on"]))}  # fmt: skip
    for name, (q, k, v, do), kwargs in cases(d):
        times, grads = {}, {}
        for setting, module in modules.items():
            if "cu_seqlens_q" in kwargs or "seqlens_q" in kwargs:  # checked once, as in training
                call = dict(sequences=module.sequences(**kwargs))
            else:
                call = {}
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]

            def both(m=module, leaves=leaves, call=call):
                return torch.autograd.grad(m.attention(*leaves, **call), leaves, do)

            def forward(m=module, call=call):
                with torch.no_grad():
                    m.attention(q, k, v, **call)

            grads[setting] = both()
            fwd = triton.testing.do_bench_cudagraph(forward, return_mode="median")
            times[setting] = triton.testing.do_bench_cudagraph(both, return_mode="median") - fwd
        same = all(torch.equal(a, b) for a, b in zip(grads["pointers"], grads["seqs_tma"]))
        print(
            f"d{d} {name}: backward {times['pointers']:.4f} ms pointers, {times['seqs_tma']:.4f} ms "
            f"seqs_tma ({times['pointers'] / times['seqs_tma']:.3f}x), same bits {same}",
            flush=True,
        )
