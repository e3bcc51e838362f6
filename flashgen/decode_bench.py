"""`flashgen bench --decode`: decoding side by side, in bytes of cache per second.

Decoding reads a whole KV cache for one or a few query rows: its speed is the
bandwidth it reaches, TB/s = bytes of K and V / time.  For every spec, batch
B, cache length Nk and query count Nq (the queries at the cache's last Nq
positions, bottom-right), this times the module's `attention()` without
gradients (the split-KV decode path, decision 052), FlexAttention (compiled;
its decoding kernel takes over for few query rows) and SDPA's cuDNN and flash
backends where the spec is expressible there (plain scores, a full mask, or
causal at Nq = 1, which sees every key), on the same q, k, v in one process.
Each system's output is compared with flashgen's.  A window's speed counts
the bytes of the whole cache, which it does not read: its TB/s says how far
its time is from reading them all.

`page_sizes` times flashgen once more per point on the same cache held as
shuffled pages (vLLM's layout, a block table per row), against its own
contiguous output, without the host's check of lengths and pages (one
synchronization per call; a serving step skips it, as a CUDA graph does).
Points whose cache (B * Nk tokens) exceeds MAX_CACHED_TOKENS are skipped.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from flashgen import display, ir
from flashgen.flex import flex_mods
from flashgen.verify import torch_dtype

BATCHES = (1, 8, 32, 128)
KEYS = (1024, 8192, 32768, 131072)
QUERIES = (1, 4)
HEADS, KV_HEADS = 32, 8  # GQA 32/8, issue 22's shapes
LAYOUTS = ("contiguous",)
SYSTEMS = ("flashgen", "flex", "sdpa-cudnn", "sdpa-flash")
# 2^22 tokens of d128 bf16 K and V at Hkv = 8: 16 GiB.
MAX_CACHED_TOKENS = 1 << 22


@dataclass(frozen=True)
class DecodeMeasurement:
    variant: str
    system: str
    layout: str
    batch: int
    n_keys: int
    n_queries: int
    heads: int
    kv_heads: int
    head_dim: int
    ms: float | None
    cache_bytes: int
    max_diff: float | None = None  # against flashgen's output
    error: str = ""
    timer: str = "do_bench"

    @property
    def tb_per_s(self) -> float | None:
        return None if self.ms is None else self.cache_bytes / self.ms / 1e9


def sdpa_expressible(variant: ir.Variant, n_queries: int) -> bool:
    """Whether SDPA computes this variant at Nq query rows, bottom-right: a
    plain score and a full mask, or causal with one row (it sees every key)."""
    if variant.score != ir.IDENTITY_SCORE:
        return False
    return variant.mask == ir.FULL or (variant.mask == ir.Name("causal") and n_queries == 1)


def points(
    batches: Sequence[int], n_keys: Sequence[int], n_queries: Sequence[int]
) -> list[tuple[int, int, int]]:
    """The (B, Nk, Nq) of the grid whose cache fits MAX_CACHED_TOKENS."""
    return [
        (b, nk, nq)
        for b in batches
        for nk in n_keys
        for nq in n_queries
        if b * nk <= MAX_CACHED_TOKENS
    ]


def bench_decode(
    variants: Sequence[ir.Variant],
    *,
    batches: Sequence[int] = BATCHES,
    n_keys: Sequence[int] = KEYS,
    n_queries: Sequence[int] = QUERIES,
    heads: int = HEADS,
    kv_heads: int = KV_HEADS,
    head_dim: int | None = None,
    systems: Sequence[str] = SYSTEMS,
    timer: str | Callable[[Callable[[], object]], float] = "do_bench",
    device: str = "cuda",
    progress: bool = True,
    on_result: Callable[[DecodeMeasurement], None] | None = None,
    page_sizes: Sequence[int] = (),
) -> list[DecodeMeasurement]:
    """Time every variant at every point of the grid on every system (see the
    module's docstring); `on_result` gets each measurement as it is taken.
    Each of `page_sizes` times flashgen once more on the same cache held as
    pages of that size in a shuffled order (`paged`), compared with its
    contiguous output (no other system reads pages)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from flashgen.api import load_variant
    from flashgen.bench import TIMERS

    timer_name, timer = (timer, TIMERS[timer]) if isinstance(timer, str) else ("custom", timer)
    backends = {"sdpa-cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa-flash": SDPBackend.FLASH_ATTENTION}
    grid = points(batches, n_keys, n_queries)
    results: list[DecodeMeasurement] = []
    cases = len(variants) * len(grid) * (len(systems) + len(page_sizes))
    with display.Progress(cases, enabled=progress) as bar:
        for variant in variants:
            if head_dim is not None:
                variant = dataclasses.replace(variant, head_dim=head_dim)
            module = load_variant(variant)
            dtype, d = torch_dtype(variant.dtype), variant.head_dim
            scale = variant.scale if variant.scale is not None else d**-0.5
            for b, nk, nq in grid:
                gen = torch.Generator(device=device).manual_seed(nk + b)
                q = torch.randn(b, heads, nq, d, device=device, dtype=dtype, generator=gen)
                k, v = (
                    torch.randn(b, kv_heads, nk, d, device=device, dtype=dtype, generator=gen)
                    for _ in "kv"
                )
                base = dict(
                    variant=variant.name, layout="contiguous", batch=b, n_keys=nk, n_queries=nq,
                    heads=heads, kv_heads=kv_heads, head_dim=d, timer=timer_name,
                    cache_bytes=2 * k.numel() * k.element_size(),
                )  # fmt: skip
                reference = None
                for system in systems:
                    label = f"{variant.name} B={b} Nk={nk} Nq={nq} {system}"
                    if system.startswith("sdpa") and not sdpa_expressible(variant, nq):
                        bar.advance(label + ": not expressible")
                        continue
                    bar.start(label)
                    if system == "flashgen":
                        fn = functools.partial(module.attention, q, k, v)
                    elif system == "flex":
                        fn = _flex(variant, q, k, v, scale, create_block_mask, flex_attention)
                    else:

                        def fn(backend=backends[system]):
                            with sdpa_kernel(backend):
                                return torch.nn.functional.scaled_dot_product_attention(
                                    q, k, v, scale=scale, enable_gqa=True
                                )

                    measured = _measure(fn, timer, reference, base, system)
                    if system == "flashgen" and not measured.error:
                        with torch.no_grad():
                            reference = fn()
                    results.append(measured)
                    if on_result is not None:
                        on_result(measured)
                    bar.advance(label)
                for size in page_sizes:
                    label = f"{variant.name} B={b} Nk={nk} Nq={nq} flashgen paged {size}"
                    bar.start(label)
                    fn = _paged_call(module, q, k, v, size)
                    measured = _measure(fn, timer, reference, base, "flashgen")
                    measured = dataclasses.replace(measured, layout=f"paged{size}")
                    results.append(measured)
                    if on_result is not None:
                        on_result(measured)
                    bar.advance(label)
    return results


def paged(k: torch.Tensor, page_size: int, order: torch.Tensor) -> torch.Tensor:
    """A contiguous cache (B, Hkv, Nk, D) as pages (B * Nk / page_size,
    page_size, Hkv, D), page j of row b at index order[b * pages_per_row + j]."""
    b, kv_heads, nk, d = k.shape
    blocks = k.reshape(b, kv_heads, nk // page_size, page_size, d).permute(0, 2, 3, 1, 4)
    pages = torch.empty(
        (b * nk // page_size, page_size, kv_heads, d), dtype=k.dtype, device=k.device
    )
    pages[order] = blocks.reshape(-1, page_size, kv_heads, d)
    return pages


def _paged_call(module, q, k, v, page_size: int) -> Callable[[], object]:
    """flashgen's KV-cache call on k and v as shuffled pages, every row full."""
    b, _, nk, _ = k.shape
    if nk % page_size:

        def refuse():  # reported as the point's error, as a system that cannot run it
            raise ValueError(f"Nk = {nk} is not a multiple of the page size {page_size}")

        return refuse
    gen = torch.Generator().manual_seed(page_size)
    order = torch.randperm(b * nk // page_size, generator=gen).to(k.device)
    table = order.view(b, nk // page_size).to(torch.int32)
    k_pages, v_pages = paged(k, page_size, order), paged(v, page_size, order)
    seqlens = torch.full((b,), nk, dtype=torch.int32, device=k.device)
    # Called as a serving engine's step calls it (check_values=False, as in a
    # captured CUDA graph): the lengths and the table, made here, are valid by
    # construction, and the check's synchronization would time the host.
    return functools.partial(
        module.attention, q, k_pages, v_pages, cache_seqlens=seqlens, block_table=table,
        check_values=False,
    )  # fmt: skip


def _flex(variant, q, k, v, scale, create_block_mask, flex_attention) -> Callable[[], object]:
    """FlexAttention on the variant at this shape, compiled afresh (each
    shape and mods recompile it)."""
    heads, nq, nk = q.shape[1], q.shape[2], k.shape[2]
    mods = flex_mods(variant, nq, nk, heads, device=q.device)
    mask_heads = heads if ir.mentions(variant.mask, frozenset({"h"})) else None
    block_mask = (
        create_block_mask(mods.mask_mod, None, mask_heads, nq, nk, device=q.device)
        if mods.mask_mod
        else None
    )
    torch._dynamo.reset()
    flex = torch.compile(flex_attention, dynamic=False)
    return functools.partial(
        flex, q, k, v, score_mod=mods.score_mod, block_mask=block_mask, scale=scale,
        enable_gqa=True,
    )  # fmt: skip


def _measure(fn, timer, reference, base: dict, system: str) -> DecodeMeasurement:
    """Time `fn()` without gradients; an error is reported, not raised."""
    ms = diff = None
    error = ""
    try:
        with torch.no_grad():
            out = fn()
            if reference is not None:
                diff = (out.float() - reference.float()).abs().max().item()
            ms = timer(fn)
    except Exception as exc:  # a system that cannot run a point is reported
        error = f"{type(exc).__name__}: {exc}"[:200]
    return DecodeMeasurement(**base, system=system, ms=ms, max_diff=diff, error=error)


def table(results: Sequence[DecodeMeasurement]) -> str:
    """TB/s per point and system, and flashgen's over the best other system's."""
    systems = list(dict.fromkeys(r.system for r in results))
    by_point: dict[tuple, dict[str, DecodeMeasurement]] = {}
    for r in results:
        key = (r.variant, r.layout, r.batch, r.n_keys, r.n_queries)
        by_point.setdefault(key, {})[r.system] = r
    columns = [
        display.Column("spec"),
        display.Column("layout"),
        *(display.Column(h, "right") for h in ("B", "Nk", "Nq")),
        *(display.Column(s, "right") for s in systems),
        display.Column("vs best other", "right"),
    ]
    rows = []
    for (name, layout, b, nk, nq), found in by_point.items():
        cells = []
        for s in systems:
            r = found.get(s)
            cells.append("—" if r is None else "error" if r.error else f"{r.tb_per_s:.2f}")
        ours = found.get("flashgen")
        others = [r.tb_per_s for s, r in found.items() if s != "flashgen" and not r.error]
        ratio = "—"
        if ours is not None and not ours.error and others:
            ratio = f"{ours.tb_per_s / max(others):.2f}×"
        rows.append([name, layout, str(b), str(nk), str(nq), *cells, ratio])
    return "TB/s of K and V (bytes of the cache / time)\n" + display.table(columns, rows)


def records(results: Sequence[DecodeMeasurement], context: dict, dtypes: dict) -> list[dict]:
    """One record per measurement: the run's `context` fields, then the
    point, the system, ms, tb_per_s, max_diff and error."""
    out = []
    for r in results:
        fields = dataclasses.asdict(r)
        fields["dtype"] = dtypes.get(r.variant)
        fields["tb_per_s"] = r.tb_per_s
        out.append({**context, "direction": "decode", **fields})
    return out
