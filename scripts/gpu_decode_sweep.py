"""Split-KV decoding's launch configurations on a GPU, and where a KV-cache
call's host time goes (issue 22; docs/decisions/052 and 056).

1. Host time per eager call (launches not awaited) at B = 1, Nk = 1024, d128,
   GQA 32/8, Nq = 1: the decode path without a cache, the cache call with and
   without the host's check of lengths (check_values), contiguous and paged;
   then cProfile's top entries for the unchecked cache call.
2. d128 GQA 32/8 bf16: each candidate (BLOCK_N, num_warps, num_stages) of
   `_attn_decode` (the module's GPU_DECODE_CONFIGS patched) at B * Nk in
   1 * 128k, 8 * 32k, 32 * 8k, Nq = 1, contiguous and in pages of 16 and 64,
   timed from a captured CUDA graph: TB/s of K and V read.
3. DeepSeek's absorbed MLA decode (16 heads against one 576-wide latent, v =
   k[..., :512], read once): each candidate at B * Nk in 1 * 32k, 8 * 8k,
   32 * 8k, 64 * 4k, Nq = 1, TB/s of the latent, beside FlexAttention's
   compiled call on the same q, k and v (v a copy there) at FLEX_SHAPES.

4. Issue 22's window bound: examples/mistral_sliding.attn (a 4,096-key
   window) as a cache call at the default configuration, B in 1, 8, 32 and
   Nk in 8k, 32k, 128k, from a captured CUDA graph: the time at 128k over the
   time at 8k (at most 1.2).

Every candidate's output is compared with the default's (max abs difference).
Worker processes compile the cases first (`--workers`); one process times.

    python3 scripts/gpu_decode_sweep.py --out $OUT/decode_sweep.jsonl   # after scripts/gpu_env.sh
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import os
import pstats
import sys
import tempfile
import time

os.environ.setdefault("FLASHGEN_CACHE_DIR", tempfile.mkdtemp(prefix="flashgen-decode-sweep-"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

GQA = "attention causal { head_dim = 128; dtype = bf16; mask = causal }"
LATENT = (
    "attention deepseek_latent { head_dim = 576; v_head_dim = 512; dtype = bf16; mask = causal }"
)
WINDOW = open(
    os.path.join(os.path.dirname(__file__), "..", "examples", "mistral_sliding.attn")
).read()
WINDOW_SHAPES = (
    (1, 8192),
    (1, 32768),
    (1, 131072),
    (8, 8192),
    (8, 131072),
    (32, 8192),
    (32, 131072),
)
GQA_SHAPES = ((1, 131072), (8, 32768), (32, 8192))
LATENT_SHAPES = ((1, 32768), (8, 8192), (32, 8192), (64, 4096))
GQA_CONFIGS = ((64, 4, 4), (64, 4, 3), (64, 8, 4), (128, 4, 3), (128, 8, 3), (32, 4, 6))
LATENT_CONFIGS = (
    (16, 8, 2), (16, 4, 2), (16, 4, 3), (16, 8, 4), (32, 4, 2), (32, 8, 2), (32, 4, 3),
    (32, 8, 3), (64, 8, 2), (64, 4, 2),
)  # fmt: skip
PAGES = (0, 16, 64)
FLEX_SHAPES = ((1, 32768), (32, 8192))  # each shape compiles Flex afresh (~30 s)


def _module(text):
    import flashgen

    return flashgen.load(text)


def _paged(k, page_size):
    """k (B, Hkv, N, D) as pages in a shuffled order, and the block table."""
    import torch

    batch, kv_heads, n, d = k.shape
    pages = k.permute(0, 2, 1, 3).reshape(-1, page_size, kv_heads, d)
    order = torch.randperm(pages.shape[0], device=k.device, generator=torch.Generator(device=k.device).manual_seed(page_size))  # fmt: skip
    out = torch.empty_like(pages)
    out[order] = pages
    return out, order.view(batch, n // page_size).to(torch.int32)


_DATA: dict = {}


def _case_inputs(kind, batch, n_keys, page):
    """q, k, v, lengths, table (or None) of one point, made once per process."""
    import torch

    key = (kind, batch, n_keys, page)
    if key in _DATA:
        return _DATA[key]
    g = torch.Generator(device="cuda").manual_seed(batch * n_keys)
    if kind in ("gqa", "window"):
        q = torch.randn(batch, 32, 1, 128, device="cuda", generator=g).bfloat16()
        k, v = (torch.randn(batch, 8, n_keys, 128, device="cuda", generator=g).bfloat16() for _ in "kv")  # fmt: skip
    else:
        q = torch.randn(batch, 16, 1, 576, device="cuda", generator=g).bfloat16()
        k = torch.randn(batch, 1, n_keys, 576, device="cuda", generator=g).bfloat16()
        v = k[..., :512]
    table = None
    if page:
        k, table = _paged(k, page)
        v, _ = _paged(v, page)
    lengths = torch.full((batch,), n_keys, dtype=torch.int32, device="cuda")
    _DATA.clear()  # one point's caches at a time (the largest is 4 GiB)
    _DATA[key] = (q, k, v, lengths, table)
    return _DATA[key]


def _call(module, kind, batch, n_keys, page, config):
    q, k, v, lengths, table = _case_inputs(kind, batch, n_keys, page)
    configs = ((module.DECODE_MAX_ROWS, *config),)  # this config at every tile of rows
    module.GPU_DECODE_CONFIGS = configs
    workspace = module.cache_workspace(q, k, table)

    def step():
        module.GPU_DECODE_CONFIGS = configs
        return module.attention(
            q, k, v, cache_seqlens=lengths, block_table=table, workspace=workspace,
            check_values=False,
        )  # fmt: skip

    return step


def cases():
    for batch, n_keys in GQA_SHAPES:
        for page in PAGES:
            for config in GQA_CONFIGS:
                yield ("gqa", batch, n_keys, page, config)
    for batch, n_keys in LATENT_SHAPES:
        for config in LATENT_CONFIGS:
            yield ("latent", batch, n_keys, 0, config)
    for batch, n_keys in WINDOW_SHAPES:
        yield ("window", batch, n_keys, 0, GQA_CONFIGS[0])


_MODULES: dict = {}


def _get(kind):
    if kind not in _MODULES:
        _MODULES[kind] = _module(dict(gqa=GQA, latent=LATENT, window=WINDOW)[kind])
    return _MODULES[kind]


def warm(share):
    import torch

    done = 0
    for kind, batch, n_keys, page, config in share:
        try:
            with torch.no_grad():
                _call(_get(kind), kind, batch, n_keys, page, config)()
            torch.cuda.synchronize()
            done += 1
        except Exception:  # recorded when timed
            pass
    return done


def _graph_ms(step):
    import triton.testing
    from gpu_kv_cache import _graph

    return triton.testing.do_bench(_graph(step).replay, warmup=25, rep=100, return_mode="median")


def _host_us(step, calls=200):
    from gpu_kv_cache import _host_us

    for _ in range(5):
        step()
    return _host_us(step, calls)


def host_profile(emit):
    import torch

    module = _get("gqa")
    q, k, v, lengths, _ = _case_inputs("gqa", 1, 1024, 0)
    pk, table = _paged(k, 64)
    pv, _ = _paged(v, 64)
    ws = module.cache_workspace(q, k)
    pws = module.cache_workspace(q, pk, table)
    steps = {
        "plain decode (no cache)": lambda: module.attention(q, k, v),
        "cache, check_values=False": lambda: module.attention(q, k, v, cache_seqlens=lengths, workspace=ws, check_values=False),  # fmt: skip
        "cache, check_values=True": lambda: module.attention(q, k, v, cache_seqlens=lengths, workspace=ws, check_values=True),  # fmt: skip
        "cache, no workspace": lambda: module.attention(q, k, v, cache_seqlens=lengths, check_values=False),  # fmt: skip
        "paged 64, check_values=False": lambda: module.attention(q, pk, pv, cache_seqlens=lengths, block_table=table, workspace=pws, check_values=False),  # fmt: skip
        "paged 64, check_values=True": lambda: module.attention(q, pk, pv, cache_seqlens=lengths, block_table=table, workspace=pws, check_values=True),  # fmt: skip
    }
    with torch.no_grad():
        for name, step in steps.items():
            emit(dict(part="host", call=name, host_us=_host_us(step), graph_ms=_graph_ms(step) if "True" not in name else None))  # fmt: skip
        for name in ("cache, check_values=False", "plain decode (no cache)"):
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(200):
                steps[name]()
            profile.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
            emit(dict(part="cprofile", call=name, calls=200, top=text.getvalue()[-4000:]))


def flex_latent(emit, batch, n_keys):
    import torch

    try:
        from torch.nn.attention.flex_attention import flex_attention

        q, k, v, _, _ = _case_inputs("latent", batch, n_keys, 0)
        v = v.contiguous()
        flex = torch.compile(flex_attention, dynamic=False)
        with torch.no_grad():
            step = lambda: flex(q, k, v, scale=576**-0.5, enable_gqa=True)  # noqa: E731
            step()
            ms = _graph_ms(step)
        emit(dict(part="latent", system="flex", batch=batch, n_keys=n_keys, ms=ms, tb_per_s=k.numel() * 2 / ms / 1e9))  # fmt: skip
    except Exception as e:  # recorded: Flex may refuse 576/512
        emit(dict(part="latent", system="flex", batch=batch, n_keys=n_keys, error=f"{type(e).__name__}: {e}"[:300]))  # fmt: skip


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--parts", nargs="*", default=["host", "gqa", "latent", "window"])
    args = parser.parse_args()
    started = time.time()
    out = open(args.out, "a")

    def emit(record):
        record["elapsed_s"] = round(time.time() - started, 1)
        line = json.dumps(record)
        print(line if record.get("part") != "cprofile" else line[:300], flush=True)
        out.write(line + "\n")
        out.flush()

    emit(dict(part="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__))
    todo = [c for c in cases() if c[0] in args.parts]
    shares = [todo[i :: args.workers] for i in range(args.workers)]
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        emit(dict(part="compiled", cases=sum(pool.map(warm, shares)), of=len(todo)))
    if "host" in args.parts:
        host_profile(emit)
    defaults = {}
    flexed = set()
    for kind, batch, n_keys, page, config in todo:
        module = _get(kind)
        record = dict(part=kind, batch=batch, n_keys=n_keys, page=page, config=config)
        try:
            with torch.no_grad():
                step = _call(module, kind, batch, n_keys, page, config)
                o = step()
                point = (kind, batch, n_keys, page)
                if point not in defaults:
                    defaults[point] = o.clone()  # the first config is the default
                record["max_diff_vs_default"] = (o.float() - defaults[point].float()).abs().max().item()  # fmt: skip
                ms = _graph_ms(step)
            q, k, v, _, _ = _case_inputs(kind, batch, n_keys, page)
            read = k.numel() * 2 * (1 if kind == "latent" else 2)
            record.update(ms=ms, tb_per_s=read / ms / 1e9)
        except Exception as e:  # does not fit: shared memory, registers
            record["error"] = f"{type(e).__name__}: {e}"[:200]
        emit(record)
        if kind == "latent" and (batch, n_keys) in FLEX_SHAPES and (batch, n_keys) not in flexed:
            flexed.add((batch, n_keys))
            flex_latent(emit, batch, n_keys)
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
