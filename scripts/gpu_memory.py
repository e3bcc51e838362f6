"""Peak GPU memory of forward + backward: generated kernels vs dense attention.

    python scripts/gpu_memory.py [SPEC]   (default examples/plain_causal.attn)

Prints, for N = 4096, 8192, 16384, torch.cuda.max_memory_allocated() over one
forward and backward of the generated module and of the dense reference in
the spec's dtype, with the inputs' own footprint subtracted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import flashgen
from flashgen.check import check
from flashgen.parse import parse
from flashgen.reference import attention_ref
from flashgen.verify import torch_dtype


def peak(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main(path: str = "examples/plain_causal.attn") -> None:
    spec, _ = parse(open(path).read(), path)
    (variant,), _ = check([spec])
    module = flashgen.load(Path(path))  # a str would be spec text
    dtype = torch_dtype(variant.dtype)
    batch, heads, dim = 1, 4, variant.head_dim
    print(f"{variant.name}: B={batch} H={heads} D={dim} {dtype}; MiB above inputs")
    print(f"{'N':>6} {'flashgen':>10} {'dense':>10}")
    for n in (4096, 8192, 16384):
        q, k, v, do = (
            torch.randn(batch, heads, n, dim, device="cuda", dtype=dtype) for _ in range(4)
        )
        for x in (q, k, v):
            x.requires_grad_()

        def ours():
            module.attention(q, k, v).backward(do)

        def dense():
            o, _ = attention_ref(variant, q, k, v, dtype=dtype)
            o.backward(do)

        mib = [peak(fn) / 2**20 for fn in (ours, dense)]
        print(f"{n:>6} {mib[0]:>10.0f} {mib[1]:>10.0f}")
        q.grad = k.grad = v.grad = None


if __name__ == "__main__":
    main(*sys.argv[1:])
