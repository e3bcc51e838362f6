"""Quick side-by-side timing of a few example modules (a stop-gap until
`flashgen bench`): forward and forward+backward TFLOP/s of the generated
kernel, FlexAttention (compiled, with a block mask) and SDPA, same inputs.

    python scripts/quick_bench.py [N]
"""

from __future__ import annotations

import sys

import torch
import triton
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import flashgen

B, H, D = 4, 16, 128
flex = torch.compile(flex_attention)


def tflops(ms: float, n: int, density: float, factor: float) -> float:
    return factor * 4 * B * H * n * n * D * density / (ms * 1e-3) / 1e12


def time_pair(fn, q, k, v, do):
    fwd = triton.testing.do_bench(lambda: fn(q, k, v), return_mode="median")
    both = triton.testing.do_bench(lambda: fn(q, k, v).backward(do), return_mode="median")
    return fwd, both - fwd


def main(n: int = 4096) -> None:
    cases = {
        "full": ("examples/full.attn", None, False),
        "causal": ("examples/plain_causal.attn", lambda b, h, q, k: q >= k, True),
    }
    print(f"B={B} H={H} N={n} D={D} bf16; TFLOP/s fwd / bwd")
    for name, (path, mask_mod, causal) in cases.items():
        module = flashgen.load(path)
        q, k, v, do = (torch.randn(B, H, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_()
        density = 0.5 if causal else 1.0
        block_mask = create_block_mask(mask_mod, None, None, n, n) if mask_mod else None
        systems = {
            "flashgen": lambda a, b, c: module.attention(a, b, c),
            "flex": lambda a, b, c: flex(a, b, c, block_mask=block_mask),
            "sdpa": lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=causal),
        }
        for system, fn in systems.items():
            fwd, bwd = time_pair(fn, q, k, v, do)
            print(f"{name:<8} {system:<9} {tflops(fwd, n, density, 1):6.0f} / {tflops(bwd, n, density, 2.5):6.0f}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
