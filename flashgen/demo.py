"""Demo: build one spec's module, run it once, compare it with the dense reference.

In: `python -m flashgen.demo [SPEC]`, SPEC a `.attn` file with one attention
block (default: examples/bloom_alibi.attn, from the repository root).  Out: the
max error of the kernel's output and log-sum-exp against the float64
reference, beside the error of an ordinary dense implementation in the same
dtype and the bound that FlashAttention's rule allows; exit 0 when within it.

Without a CUDA GPU the kernel runs on the CPU under TRITON_INTERPRET=1 (set
here, before the generated module defines its kernels).  The interpreter has
no bf16 dot product, so on the CPU use an fp16 or fp32 spec.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import torch

import flashgen
from flashgen import api, ir
from flashgen.reference import attention_ref
from flashgen.verify import tolerance, torch_dtype

DEFAULT_SPEC = "examples/bloom_alibi.attn"
# Odd lengths catch tiling off-by-ones; 4 heads give ALiBi distinct slopes.
BATCH, HEADS, N_QUERIES, N_KEYS = 2, 4, 113, 203


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flashgen.demo",
        description="Build a spec, run its kernel once, compare with the reference.",
    )
    parser.add_argument("spec", nargs="?", default=DEFAULT_SPEC, metavar="SPEC")
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    path = args.spec
    try:
        text = api.read_spec_file(path)
        variants, _ = api.check_sources({path: text})
    except OSError as e:
        print(f"demo: error: cannot read '{path}': {e.strerror or e}", file=sys.stderr)
        return 2
    except api.SpecFileError as e:
        print(f"demo: error: cannot read '{path}': {e.reason}", file=sys.stderr)
        return 2
    except flashgen.SpecError as e:
        print(e, file=sys.stderr)
        return 1
    if len(variants) != 1:
        names = ", ".join(v.name for v in variants)
        print(
            f"demo: error: {path} defines {len(variants)} attention blocks ({names}); "
            "the demo runs a spec with one",
            file=sys.stderr,
        )
        return 2
    variant = variants[0]
    if device == "cpu" and variant.dtype is ir.DType.BF16:
        print(
            f"demo: error: {variant.name} is bf16, which the Triton CPU interpreter "
            "cannot multiply; pick an fp16 or fp32 spec, or run on a GPU",
            file=sys.stderr,
        )
        return 2

    try:
        module = api.load_variant(variant)
    except (OSError, ValueError) as e:  # the module cache refused; a bad tuning sidecar
        print(f"demo: error: {e}", file=sys.stderr)
        return 2

    dtype = torch_dtype(variant.dtype)
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(BATCH, HEADS, N_QUERIES, variant.head_dim, generator=generator)
    k = torch.randn(BATCH, HEADS, N_KEYS, variant.head_dim, generator=generator)
    v = torch.randn(BATCH, HEADS, N_KEYS, variant.v_dim, generator=generator)
    q, k, v = (x.to(dtype=dtype, device=device) for x in (q, k, v))

    start = time.perf_counter()
    o, lse = module.attention(q, k, v, return_lse=True)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    ref_o, ref_lse = attention_ref(variant, q.double(), k.double(), v.double())
    ord_o, ord_lse = attention_ref(variant, q, k, v, dtype=dtype)

    where = "cpu, Triton interpreter" if device == "cpu" else torch.cuda.get_device_name()
    print(f"flashgen demo: {variant.name} from {path}")
    print(f"  module   {module.__file__}")
    print(f"  inputs   q {tuple(q.shape)}, k v {tuple(k.shape)}, {variant.dtype.value}")
    print(f"  ran on   {where} in {seconds:.2f} s")
    ok = True
    for what, out, ref, ordinary in (("o", o, ref_o, ord_o), ("lse", lse, ref_lse, ord_lse)):
        check = tolerance(out.cpu(), ref.cpu(), ordinary.cpu(), dtype, what=what)
        print(
            f"  max |{what} - ref| = {check.error:.2e}   "
            f"(ordinary {variant.dtype.value}: {check.ordinary_error:.2e}, "
            f"bound {check.bound:.2e})  {'ok' if check.ok else 'FAIL'}"
        )
        ok = ok and check.ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
