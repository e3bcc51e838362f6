"""KV-cache decoding on a GPU (issue 22 items 2-3, docs/decisions/056-kv-cache-layouts.md).

For each shape and layout (a contiguous (B, Hkv, Nmax, D) cache, and paged
(pages, page_size, Hkv, D) caches of 16, 64 and 256 keys per page, pages in
a random order): the cache call's o and lse for batch row 0 at a ragged
length against the float64 reference by the 2x rule (flashgen.verify.tolerance),
paged against contiguous (the same bits where BLOCK_N is the same), then the
bandwidth of K and V (bytes of the rows' keys and values / median time of
`triton.testing.do_bench`) with every row full, eager and replayed from a
captured CUDA graph, and the eager call's host time.  One JSON line per point
in --out.

    python3 scripts/gpu_kv_cache.py --out $OUT/kv_cache.jsonl    # after scripts/gpu_env.sh

Shapes as scripts/gpu_decode.py: bf16, d128, H = 32, Hkv = 8, causal,
B * Nk in 32 * 8k, 8 * 32k, 1 * 128k, Nq in 1 and 4 (--shapes 128x32768,
--nq, --page-sizes pick others).  Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("FLASHGEN_CACHE_DIR", tempfile.mkdtemp(prefix="flashgen-kv-cache-"))
import flashgen  # noqa: E402
from flashgen.check import check  # noqa: E402
from flashgen.parse import parse  # noqa: E402
from flashgen.reference import attention_ref  # noqa: E402
from flashgen.verify import tolerance  # noqa: E402

SHAPES = [(32, 8192), (8, 32768), (1, 131072)]  # (B, Nk)
PAGE_SIZES = [16, 64, 256]


def _variant(text: str):
    spec, diags = parse(text)
    assert not diags, diags
    (variant,), diags = check([spec])
    assert not diags, diags
    return variant


def _paged(k: torch.Tensor, page_size: int, order: torch.Tensor):
    """k (B, Hkv, N, D) as pages (B * N / page_size, page_size, Hkv, D), page
    i of the row-major order stored at order[i]; the block table."""
    batch, kv_heads, n, d = k.shape
    pages = k.permute(0, 2, 1, 3).reshape(-1, page_size, kv_heads, d)
    out = torch.empty_like(pages)
    out[order] = pages
    return out, order.view(batch, n // page_size).to(torch.int32)


def _host_us(step, calls: int = 50) -> float:
    """Host time per call, launches not awaited."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        step()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def _graph(step):
    """step captured in a CUDA graph (after a warm-up on a side stream)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--nq", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--shapes", nargs="+", default=[f"{b}x{n}" for b, n in SHAPES], help="B x Nk, as 8x32768"
    )
    parser.add_argument("--page-sizes", type=int, nargs="+", default=PAGE_SIZES)
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes]
    failed = 0
    heads, kv_heads, d = 32, 8, 128
    text = f"attention causal {{ head_dim = {d}; dtype = bf16; mask = causal }}"
    mod, variant = flashgen.load(text), _variant(text)
    started = time.time()
    with open(args.out, "a") as out, torch.no_grad():
        for batch, capacity in shapes:
            g = torch.Generator(device="cuda").manual_seed(0)
            k, v = (
                torch.randn(batch, kv_heads, capacity, d, device="cuda", generator=g).bfloat16()
                for _ in "kv"
            )
            order = torch.randperm(batch * capacity // 16, device="cuda", generator=g)
            full = torch.full((batch,), capacity, dtype=torch.int32, device="cuda")
            ragged = torch.randint(
                capacity // 2, capacity + 1, (batch,), device="cuda", generator=g
            ).to(torch.int32)
            ragged[0] = capacity - 77  # row 0, the one checked, ends inside a page
            for nq in args.nq:
                q = torch.randn(batch, heads, nq, d, device="cuda", generator=g).bfloat16()
                n0 = int(ragged[0])
                one = (q[:1], k[:1, :, :n0], v[:1, :, :n0])
                ref = attention_ref(
                    variant, *(x.double() for x in one), offsets=(n0 - nq, 0)
                )  # fmt: skip
                dense = attention_ref(variant, *one, dtype=torch.bfloat16, offsets=(n0 - nq, 0))
                contiguous = None
                for page_size in [0] + args.page_sizes:
                    if page_size:
                        pages = order[: batch * capacity // page_size]
                        pages = pages.argsort().argsort()  # a permutation of these pages
                        k_cache, table = _paged(k, page_size, pages)
                        v_cache, _ = _paged(v, page_size, pages)
                    else:
                        k_cache, v_cache, table = k, v, None
                    record = dict(
                        spec="causal", batch=batch, capacity=capacity, n_queries=nq,
                        heads=heads, kv_heads=kv_heads, head_dim=d,
                        layout=f"paged{page_size}" if page_size else "contiguous",
                    )  # fmt: skip
                    call = dict(block_table=table, return_lse=True)
                    o, lse = mod.attention(q, k_cache, v_cache, cache_seqlens=ragged, **call)
                    checks = [
                        tolerance(o[:1].cpu(), ref[0].cpu(), dense[0].cpu(), torch.bfloat16),
                        tolerance(lse[:1].cpu(), ref[1].cpu(), dense[1].cpu(), torch.bfloat16, what="lse"),
                    ]  # fmt: skip
                    record["checks"] = [
                        dict(what=c.what, error=c.error, bound=c.bound, ok=c.ok) for c in checks
                    ]
                    ok = all(c.ok for c in checks)
                    if contiguous is None:
                        contiguous = (o, lse)
                    else:
                        record["same_bits_as_contiguous"] = bool(
                            torch.equal(o, contiguous[0]) and torch.equal(lse, contiguous[1])
                        )
                        record["max_abs_vs_contiguous"] = (
                            (o.float() - contiguous[0].float()).abs().max().item()
                        )
                        if page_size >= 64:  # BLOCK_N = 64 either way: the same splits
                            ok &= record["same_bits_as_contiguous"]
                    failed += not ok
                    workspace = mod.cache_workspace(q, k_cache, table)
                    kw = dict(cache_seqlens=full, block_table=table, workspace=workspace)

                    def step(kw=kw, k_cache=k_cache, v_cache=v_cache):
                        return mod.attention(q, k_cache, v_cache, check_values=False, **kw)

                    kv_bytes = 2 * batch * kv_heads * capacity * d * 2
                    ms = triton.testing.do_bench(step)
                    record["eager"] = dict(ms=ms, tb_per_s=kv_bytes / ms / 1e9)
                    record["eager_host_us"] = _host_us(step)
                    try:
                        graph = _graph(step)
                        ms = triton.testing.do_bench(graph.replay)
                        record["graph"] = dict(ms=ms, tb_per_s=kv_bytes / ms / 1e9)
                    except Exception as e:  # noqa: BLE001 - recorded, and a failure
                        record["graph"] = dict(error=f"{type(e).__name__}: {e}"[:300])
                        failed += 1
                    record["elapsed_s"] = round(time.time() - started, 1)
                    print(json.dumps(record), flush=True)
                    out.write(json.dumps(record) + "\n")
                    del k_cache, v_cache
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
