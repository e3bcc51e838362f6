"""Split-KV decoding on a GPU (issue 22 item 1, docs/decisions/052-decode-split-kv.md).

For each spec and shape: the decode path's o and lse against the float64
reference by the 2x rule (flashgen.verify.tolerance) and against the ordinary
forward kernel of the same module, then the bandwidth of K and V (bytes of K
and V / median time of `triton.testing.do_bench`) of flashgen's decode, of
its ordinary forward (a launch config forces it), and of cuDNN SDPA and
SDPA's flash backend where they have the variant (full; causal with Nq = 1
is full too); and the decode path's host time per call when Nk changes
every call, as in generation.  Every result is a JSON line in --out.

    python3 scripts/gpu_decode.py --out $OUT/decode.jsonl    # after scripts/gpu_env.sh

The shapes are ANCHORS.md's decode table: bf16, d128, H = 32, Hkv = 8,
B * Nk in 32 * 8k, 8 * 32k, 1 * 128k, Nq in 1 and 4.  Exit status 1 when a
check fails.
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
os.environ.setdefault("FLASHGEN_CACHE_DIR", tempfile.mkdtemp(prefix="flashgen-decode-"))
import flashgen  # noqa: E402
from flashgen.check import check  # noqa: E402
from flashgen.parse import parse  # noqa: E402
from flashgen.reference import attention_ref  # noqa: E402
from flashgen.verify import tolerance  # noqa: E402

SPECS = {
    "full": "mask = full",
    "causal": "mask = causal",
    "mistral_sliding": "mask = causal & window(4095)",
    "gemma2_softcap": "mask = causal & window(4095); score = softcap(s, 50.0)",
    "bloom_alibi": "mask = causal; score = s + alibi",
}
# (B, Nk); B = 1 at 8k beside 128k: a window's time must not grow with the cache.
SHAPES = [(32, 8192), (8, 32768), (1, 131072), (1, 8192)]


def _variant(text: str):
    spec, diags = parse(text)
    assert not diags, diags
    (variant,), diags = check([spec])
    assert not diags, diags
    return variant


def _spda(backend):
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    return run


def _host_us(step, calls: int = 50) -> float:
    """Host time per call of step(i), i = 0 .. calls - 1, launches not awaited,
    after four calls that compile what the lengths' divisibility specializes."""
    for i in range(4):
        step(i)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        step(i)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--specs", nargs="+", default=list(SPECS))
    parser.add_argument("--nq", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    from torch.nn.attention import SDPBackend

    failed = 0
    heads, kv_heads, d = 32, 8, 128
    with open(args.out, "a") as out:
        for name in args.specs:
            text = f"attention {name} {{ head_dim = {d}; dtype = bf16; {SPECS[name]} }}"
            mod, variant = flashgen.load(text), _variant(text)
            for batch, n_keys in SHAPES:
                for nq in args.nq:
                    g = torch.Generator(device="cuda").manual_seed(0)
                    q = torch.randn(batch, heads, nq, d, device="cuda", generator=g).bfloat16()
                    k, v = (
                        torch.randn(
                            batch, kv_heads, n_keys, d, device="cuda", generator=g
                        ).bfloat16()
                        for _ in "kv"
                    )
                    record = dict(
                        spec=name,
                        batch=batch,
                        n_keys=n_keys,
                        n_queries=nq,
                        heads=heads,
                        kv_heads=kv_heads,
                        head_dim=d,
                    )
                    with torch.no_grad():
                        o, lse = mod.forward(q, k, v)
                        ordinary = mod.forward(q, k, v, block_m=64, block_n=64)
                    # The float64 reference of the first batch row.
                    one = [x[:1] for x in (q, k, v)]
                    ref = attention_ref(variant, *(x.double() for x in one))
                    dense = attention_ref(variant, *one, dtype=torch.bfloat16)
                    checks = [
                        tolerance(o[:1].cpu(), ref[0].cpu(), dense[0].cpu(), torch.bfloat16),
                        tolerance(lse[:1].cpu(), ref[1].cpu(), dense[1].cpu(), torch.bfloat16, what="lse"),
                        tolerance(o[:1].cpu(), ref[0].cpu(), ordinary[0][:1].cpu(), torch.bfloat16, what="o vs ordinary"),
                    ]  # fmt: skip
                    record["checks"] = [
                        dict(what=c.what, error=c.error, bound=c.bound, ok=c.ok) for c in checks
                    ]
                    failed += not all(c.ok for c in checks)
                    record["decode_vs_ordinary_max_abs"] = (
                        (o.float() - ordinary[0].float()).abs().max().item()
                    )
                    kv_bytes = 2 * k.numel() * k.element_size()
                    systems = {
                        "flashgen_decode": lambda: mod.forward(q, k, v),
                        "flashgen_ordinary": lambda: mod.forward(q, k, v, block_m=64, block_n=64),
                    }
                    if name in ("full",) or (name == "causal" and nq == 1):
                        systems["sdpa_cudnn"] = lambda: _spda(SDPBackend.CUDNN_ATTENTION)(q, k, v)
                        systems["sdpa_flash"] = lambda: _spda(SDPBackend.FLASH_ATTENTION)(q, k, v)
                    for system, fn in systems.items():
                        try:
                            ms = triton.testing.do_bench(fn)
                            record[system] = dict(ms=ms, tb_per_s=kv_bytes / ms / 1e9)
                        except Exception as e:  # a backend that refuses the shape
                            record[system] = dict(error=f"{type(e).__name__}: {e}"[:200])
                    # A decode step sees one more key each time: a new Nk per call.
                    record["flashgen_decode_host_us_new_nk"] = _host_us(
                        lambda i: mod.forward(q, k[:, :, : n_keys - i], v[:, :, : n_keys - i])
                    )
                    print(json.dumps(record), flush=True)
                    out.write(json.dumps(record) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
