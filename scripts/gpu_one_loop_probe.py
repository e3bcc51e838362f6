"""Probe: the Triton forward with its three key loops (masked edge tiles, the
unmasked interior, masked edge tiles) merged into one loop whose edge tiles
take the elementwise mask in a branch over registers, so that the loads of
every tile are software-pipelined together.  A text patch of the generated
module, for a measurement before the template changes.

    python3 scripts/gpu_one_loop_probe.py
"""

from __future__ import annotations

import re
import sys

import torch
import triton.testing

sys.path.insert(0, ".")
from flashgen import api  # noqa: E402
from flashgen.api import _check_specs, _render, tuning_for  # noqa: E402
from flashgen.verify import Shape, random_runtime_inputs  # noqa: E402

MASKS = (
    ("packed_docs", "causal & doc[b, q] == doc[b, k]", 16384),
    ("chunked_causal", "causal & chunk(1024)", 16384),
    ("band_129", "abs(q - k) < 65", 4096),
    ("window_1024", "causal & q - k < 1024", 16384),
    ("causal", "causal", 4096),
)
CONFIGS = ((64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3))


def one_loop(text: str) -> str:
    # The tile function takes a runtime `edge`: the mask applies where it is set.
    text = text.replace(
        "MASKED: tl.constexpr, USE_TMA: tl.constexpr,\n):  # fmt: skip\n"
        '    """One key tile of the online softmax',
        "MASKED: tl.constexpr, USE_TMA: tl.constexpr, edge=False,\n):  # fmt: skip\n"
        '    """One key tile of the online softmax',
        1,
    )
    fwd_tile = text.index("def _attn_fwd_tile(")
    call = re.compile(r"    s2 = _scores_log2\(\n(.*?), MASKED\n    \)  # fmt: skip\n", re.S)
    m = call.search(text, fwd_tile)
    args = m.group(1)
    replacement = (
        f"    s2 = _scores_log2(\n{args}, False\n    )  # fmt: skip\n"
        "    if MASKED:\n"
        "        if edge:\n"
        f"            s2 = _scores_log2(\n{args}, True\n            )  # fmt: skip\n"
    )
    text = text[: m.start()] + replacement + text[m.end() :]
    # The forward kernel: one loop over [lo, hi).
    start = text.index("def _attn_fwd(")
    first = text.index("    for start_n in range(lo, mid_lo, BLOCK_N):", start)
    last_loop = text.index("    for start_n in range(mid_hi, hi, BLOCK_N):", start)
    end = text.index("\n\n    if HAS_SINKS:", last_loop)
    body = text[first:end]
    calls = re.findall(r"acc, l_i, m_i = _attn_fwd_tile\(\n(.*?)\)  # fmt: skip", body, re.S)
    unmasked = calls[1]
    tile_call = unmasked.replace("BLOCK_N, False, USE_TMA,", "BLOCK_N, True, USE_TMA, edge,")
    merged = (
        "    for start_n in range(lo, hi, BLOCK_N):\n"
        "        edge = (start_n < mid_lo) | (start_n >= mid_hi)\n"
        "        acc, l_i, m_i = _attn_fwd_tile(\n"
        + "\n".join("    " + line if line else line for line in tile_call.split("\n"))
        + ")  # fmt: skip"
    )
    return text[:first] + merged + text[end:]


def spec_text(name, mask, d):
    inputs = "doc: int32[B, Nk]; " if "doc[" in mask else ""
    return f"attention {name} {{ head_dim = {d}; dtype = bf16; {inputs}mask = {mask} }}"


def main():
    knobs = (("gluon_forward", None), ("gluon_backward", False))
    for name, mask, n in MASKS:
        for d in (64, 128):
            (variant,) = _check_specs([spec_text(name, mask, d)])
            text = _render(variant, tuning_for(variant), knobs)
            base = api._import(name, text)
            patched_text = one_loop(text)
            patched = api._import(name, patched_text)
            b, h = 16384 // n, 16
            gen = torch.Generator(device="cuda").manual_seed(n)
            q, k, v = (
                torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(3)
            )
            data = random_runtime_inputs(
                variant, Shape(b, h, h, n, n), "cuda",
                generator=torch.Generator().manual_seed(n), mean_run=1000,
            )  # fmt: skip
            for c in CONFIGS:
                kw = dict(block_m=c[0], block_n=c[1], num_warps=c[2], num_stages=c[3])
                try:
                    o0, l0 = base.forward(q, k, v, **kw, **data)
                    o1, l1 = patched.forward(q, k, v, **kw, **data)
                except Exception as e:
                    print(name, d, c, "error", type(e).__name__, str(e)[:100], flush=True)
                    continue
                same = torch.equal(o0, o1) and torch.equal(l0, l1)
                t0 = triton.testing.do_bench(lambda: base.forward(q, k, v, **kw, **data))
                t1 = triton.testing.do_bench(lambda: patched.forward(q, k, v, **kw, **data))
                print(
                    f"{name} d{d} {c}: three loops {t0:.3f} ms, one loop {t1:.3f} ms "
                    f"({t0 / t1:.2f}x), same bits {same}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
