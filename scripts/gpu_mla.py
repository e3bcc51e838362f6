"""MLA's v_head_dim on a GPU (issue 22 item 4, docs/decisions/055-mla-v-head-dim.md).

1. examples/deepseek_mla.attn (bf16, causal, head_dim 192, v_head_dim 128):
   forward (o, lse) and backward (dq, dk, dv) against the float64 reference by
   the project's rule (flashgen.verify.check_forward / check_backward), then
   forward and forward+backward TFLOP/s against FlexAttention (which takes
   Dv != D) at B = 4, H = 16, N in 1024 and 4096.
2. DeepSeek-V3's absorbed decode: 16 query heads against one latent cache
   (Hkv = 1), k (B, 1, Nk, 576) and v = k[..., :512], a view; o and lse
   against the reference (first batch row), and the time of the decode path
   with the bytes of the latent read (once per call) per second.

Every result is a JSON line in --out; exit status 1 when a check fails.
Within about 150 s on an H200 (compiles included).

    python3 scripts/gpu_mla.py --out $OUT/mla.jsonl    # after scripts/gpu_env.sh
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FLASHGEN_CACHE_DIR", tempfile.mkdtemp(prefix="flashgen-mla-"))
import flashgen  # noqa: E402
from flashgen.check import check  # noqa: E402
from flashgen.parse import parse  # noqa: E402
from flashgen.reference import attention_ref  # noqa: E402
from flashgen.verify import Shape, check_backward, check_forward, tolerance  # noqa: E402

LATENT = (
    "attention deepseek_latent { head_dim = 576; v_head_dim = 512; dtype = bf16; mask = causal }"
)


def _variant(text: str):
    spec, diags = parse(text)
    assert not diags, diags
    (variant,), diags = check([spec])
    assert not diags, diags
    return variant


def _checks(result) -> list[dict]:
    return [dict(what=c.what, error=c.error, bound=c.bound, ok=c.ok) for c in result.checks]


def _flex(scale: float):
    """FlexAttention (compiled) with a causal block mask, or None without it."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    compiled = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def run(q, k, v):
        n_q, n_k = q.shape[2], k.shape[2]
        if (n_q, n_k) not in masks:
            masks[(n_q, n_k)] = create_block_mask(
                lambda b, h, i, j: j <= i + (n_k - n_q), None, None, n_q, n_k, device="cuda"
            )
        return compiled(q, k, v, block_mask=masks[(n_q, n_k)], scale=scale)

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    args = parser.parse_args()
    started = time.perf_counter()
    failed = 0
    out = open(args.out, "a")

    def emit(record: dict) -> None:
        record["elapsed_s"] = round(time.perf_counter() - started, 1)
        line = json.dumps(record)
        print(line, flush=True)
        out.write(line + "\n")
        out.flush()

    text = (ROOT / "examples" / "deepseek_mla.attn").read_text()
    variant, module = _variant(text), flashgen.load(text)
    d, dv = variant.head_dim, variant.v_dim
    scale = d**-0.5
    env = dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        triton=triton.__version__,
        config=module.GPU_CONFIG,
        bwd_config=module.GPU_BWD_CONFIG,
    )
    emit(dict(part="env", **env))

    # 1. Correctness of the example, forward and backward.
    g = torch.Generator().manual_seed(0)
    for shape in (Shape(2, 8, 2, 333, 333), Shape(1, 16, 16, 200, 517)):
        q = torch.randn(shape.batch, shape.heads, shape.n_queries, d, generator=g)
        k = torch.randn(shape.batch, shape.kv_heads, shape.n_keys, d, generator=g)
        v = torch.randn(shape.batch, shape.kv_heads, shape.n_keys, dv, generator=g)
        q, k, v = (x.cuda().bfloat16() for x in (q, k, v))
        for what, run in (("forward", check_forward), ("backward", check_backward)):
            try:
                result = run(variant, module, q, k, v)
                failed += not result.ok
                emit(dict(part=f"deepseek_mla {what}", shape=str(shape), ok=result.ok, checks=_checks(result)))  # fmt: skip
            except Exception as e:  # a compile or launch failure is a result too
                failed += 1
                emit(dict(part=f"deepseek_mla {what}", shape=str(shape), error=f"{type(e).__name__}: {e}"[:400]))  # fmt: skip

    # 1b. Speed against FlexAttention: causal FLOPs (half of 2 * (D + Dv) N^2 per head).
    flex = _flex(scale)
    batch, heads = 4, 16
    for n in args.seqlens:
        q = torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(batch, heads, n, dv, device="cuda", dtype=torch.bfloat16)
        flops = batch * heads * n * n * (d + dv)  # 2 (D + Dv) N^2, halved by the causal mask
        # The backward's five products: QK^T, dQ and dK over D, dP and dV over Dv.
        bwd_flops = batch * heads * n * n * (3 * d + 2 * dv)
        systems = {"flashgen": lambda a, b, c: module.attention(a, b, c)}
        if flex is not None:
            systems["flex"] = flex
        record = dict(part="deepseek_mla speed", batch=batch, heads=heads, seqlen=n)
        for name, fn in systems.items():
            leaves = [x.detach().requires_grad_() for x in (q, k, v)]
            do = torch.randn(batch, heads, n, dv, device="cuda", dtype=torch.bfloat16)

            def fwd():
                with torch.no_grad():
                    return fn(q, k, v)

            def fwd_bwd():
                o = fn(*leaves)
                o.backward(do)

            try:
                fwd_ms = triton.testing.do_bench(fwd, warmup=10, rep=40)
                both_ms = triton.testing.do_bench(fwd_bwd, warmup=10, rep=40, grad_to_none=leaves)
                record[name] = dict(
                    fwd_ms=fwd_ms,
                    fwd_tflops=flops / fwd_ms / 1e9,
                    bwd_ms=both_ms - fwd_ms,
                    bwd_tflops=bwd_flops / max(both_ms - fwd_ms, 1e-6) / 1e9,
                )
            except Exception as e:
                record[name] = dict(error=f"{type(e).__name__}: {e}"[:400])
        emit(record)
        if time.perf_counter() - started > 110:
            emit(dict(part="note", text="out of time before the longer sequences"))
            break

    # 2. The absorbed decode: one 576-wide latent, v its first 512 columns.
    latent, latent_module = _variant(LATENT), flashgen.load(LATENT)
    heads = 16
    for batch, n_keys, n_queries in ((1, 4096, 1), (8, 8192, 1), (4, 4096, 2)):
        gen = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(batch, heads, n_queries, 576, device="cuda", generator=gen).bfloat16()
        k = torch.randn(batch, 1, n_keys, 576, device="cuda", generator=gen).bfloat16()
        v = k[..., :512]
        record = dict(part="absorbed decode", batch=batch, n_keys=n_keys, n_queries=n_queries)
        try:
            with torch.no_grad():
                o, lse = latent_module.forward(q, k, v)
            one = [x[:1] for x in (q, k, v)]
            ref = attention_ref(latent, *(x.double() for x in one))
            dense = attention_ref(latent, *one, dtype=torch.bfloat16)
            checks = [
                tolerance(o[:1].cpu(), ref[0].cpu(), dense[0].cpu(), torch.bfloat16),
                tolerance(lse[:1].cpu(), ref[1].cpu(), dense[1].cpu(), torch.bfloat16, what="lse"),
            ]  # fmt: skip
            record["checks"] = [
                dict(what=c.what, error=c.error, bound=c.bound, ok=c.ok) for c in checks
            ]
            failed += not all(c.ok for c in checks)
            ms = triton.testing.do_bench(lambda: latent_module.forward(q, k, v), rep=50)
            record["ms"] = ms
            record["latent_tb_per_s"] = k.numel() * k.element_size() / ms / 1e9
        except Exception as e:
            failed += 1
            record["error"] = f"{type(e).__name__}: {e}"[:400]
        emit(record)
    out.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
