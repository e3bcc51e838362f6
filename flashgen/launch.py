"""Launch configurations: the block sizes, warps, stages and TMA choices a
module gets by default (measured on the H200), and the `Tuning` that
`flashgen tune` measures to replace them."""

from __future__ import annotations

from dataclasses import dataclass

from flashgen import ir


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int

    def kwargs(self) -> dict[str, int]:
        """Keyword arguments of a generated module's forward() and backward()."""
        return dict(
            block_m=self.block_m,
            block_n=self.block_n,
            num_warps=self.num_warps,
            num_stages=self.num_stages,
        )


@dataclass(frozen=True)
class Tuning:
    """Launch configurations measured by `flashgen tune` on one GPU."""

    device: str
    forward: LaunchConfig
    backward: LaunchConfig
    # What was measured: the configs apply only to this head dim and dtype.
    head_dim: int | None = None
    dtype: str | None = None
    # Whether TMA loads were faster (None: not measured, keep the default).
    forward_tma: bool | None = None
    backward_tma: bool | None = None


def gpu_config(
    head_dim_pad: int, dtype: ir.DType, masked: bool, v_dim_pad: int | None = None
) -> LaunchConfig:
    """Forward block sizes that fit Hopper's 228 KB of shared memory per SM.
    `masked`: the mask can cut a tile (it reads positions).  `v_dim_pad`: v's
    padded head dim where it is narrower than q's and k's (MLA).

    Measured on the H200 (BENCHMARKS.md, sweeps 2-3): without a mask, large
    tiles win (128 x 64 at d64, 128 x 128 at d128); with a mask, 64 x 64 with
    4 warps wins, as large tiles waste work on the boundary.  `flashgen tune`
    replaces these per spec.  Swept again over eight configurations and six
    masks with short and long rows (benchmarks/config_sweep.jsonl, 2026-12-02,
    bf16, merged edge loops): 64 x 64 x 4 x 3 was the fastest for documents,
    chunks, windows and bands at d64 and d128, and within 3% / 6% (d64 / d128)
    for causal at N = 16384 (whose d128 forward is the Gluon kernel's).
    """
    if dtype is ir.DType.FP32:
        if head_dim_pad <= 64:
            return LaunchConfig(64, 32, 4, 3)
        if head_dim_pad <= 128:
            # Spill-free with CUDA-core products (64 x 32 spilled 6 KB).
            return LaunchConfig(32, 16, 4, 2)
        if head_dim_pad <= 256:
            # At d192 and d256 64 x 16 spilled 5 KB per thread on plain causal
            # and up to 90 KB on drawn specs, 32 x 16 up to 20 KB in the padded
            # and varlen kernel; 16 x 16 spills nothing on either but on two
            # drawn specs (scripts/sm90_resources.py, decision 082; not yet
            # timed on a GPU).
            return LaunchConfig(16, 16, 4, 2)
        return LaunchConfig(16, 16, 4, 1)
    if head_dim_pad > 256:  # MLA's 576-wide K (1024-wide tiles; not yet measured)
        return LaunchConfig(16, 16, 8, 1)
    if head_dim_pad > 128 and v_dim_pad is not None and v_dim_pad <= 128:
        # MLA's 192 / 128 (q and k padded to 256): 64 x 32 with 4 warps and 3
        # stages took 1.04 ms against 2.30 for 64 x 32 x 8 x 2, causal, B = 4,
        # H = 16, N = 4096 (scripts/gpu_config_sweep.py --head-dims 192
        # --v-head-dim 128 --wide, 2026-12-03, decision 063); 128 x 32 x 8 x 2
        # tied (1.035), the narrower tile wastes less where a mask cuts it.
        return LaunchConfig(64, 32, 4, 3)
    if head_dim_pad > 128:
        return LaunchConfig(64, 32, 8, 2)
    if masked:
        return LaunchConfig(64, 64, 4, 3)
    return LaunchConfig(128, 64, 8, 3) if head_dim_pad <= 64 else LaunchConfig(128, 128, 8, 3)


def gpu_bwd_config(
    head_dim_pad: int,
    dtype: ir.DType,
    short_rows: bool = False,
    v_dim_pad: int | None = None,
    learnable: bool = False,
    heavy_score: bool = False,
) -> LaunchConfig:
    """Backward tiles.  The dK/dV kernel keeps two BLOCK_N x HEAD_DIM fp32
    accumulators in registers, so wide heads get narrower key tiles.

    `short_rows`: each program sees a few tiles (`kernel_choice.merged_edges`).
    At d128 64 x 64 with 4 warps and 2 stages then beats 64 x 128 x 8 x 3 on
    the H200 (scripts/gpu_config_sweep.py, 2026-12-02, bf16, merged loops):
    1.10 ms against 1.26 for packed documents of ~1000 tokens, 0.60 against
    0.64 for causal chunks of 1024, 1.03 against 1.10 for a 1024-key window,
    0.31 against 0.42 for a 129-key band; it loses at causal N = 16384
    (7.26 ms against 6.77).  At d64 the default was best or within 6%.
    `v_dim_pad`: as in `gpu_config`.

    `learnable`: the dQ programs also sum the gradients of learnable reads
    (decision 086).  At 64 x 64 x 4 x 3 the t5_relative_bias example's
    backward spilled 1.7 KB per thread on sm_90a, and the CUDA 12.8 ptxas that
    Triton 3.6 ships assembled it wrong: its table's gradient was off by up to
    15 at Nq 1023, Nk 2048 on an H100 (fp16 and bf16), while the same PTX
    assembled by CUDA 13.0's ptxas was right, as was every other launch tried
    (2026-12-05, scripts/gpu_t5_gradient.py).  32 x 64 x 4 x 3 spills nothing
    there and was right at four shapes.  Above d64, 64 x 128 x 8 x 2 spills
    (2.7 KB for the T5 example at d128, 104-512 B for drawn specs at d80) but
    was right on an H100 in fp16 and bf16: at d128 and d80 for all five forms of
    learnable read (table, rows, pairs, per key, decay;
    `test_learnable_gradients_at_head_dim_128`, b6bafb2 and 9ee2515), at d96 and
    d112 for the T5 table (`gpu_t5_gradient.py --head-dim`), and it runs the
    learnable backward 1.9-2.7x faster than the spill-free 32 x 64 x 8 x 2
    (decisions 086 and 096).

    `heavy_score`: the score's derivative is heavy (`kernel_choice.heavy_derivative`),
    which keeps such specs on the Triton backward at d128.  At 64 x 128 x 8 x 3
    and 64 x 64 x 4 x 2 their dK/dV programs spilled 80-1,916 B on sm_90a; the
    spill-free 32 x 64 x 4 x 3 ran 36 of 37 of them faster on an H100 (median
    1.31x, 0.94-2.45x; bf16, B4 H16 N4096, decision 097), where the score `s`
    lost 3-9% and positional derivatives alone were mixed (7 of 10, 0.89-1.30x)."""
    wide = dtype is ir.DType.FP32
    if learnable and not wide and head_dim_pad <= 128:
        return LaunchConfig(32, 64, 4, 3) if head_dim_pad <= 64 else LaunchConfig(64, 128, 8, 2)
    if wide and head_dim_pad <= 128:
        # CUDA-core products: 64 x 64 x 4 x 2 spilled 4-57 KB per thread at d32
        # and d64 on sm_90a, 32 x 32 x 4 x 2 1.5-3 KB at d128; these spill
        # nothing on plain causal, a softcapped window and two drawn specs
        # (scripts/sm90_resources.py, decision 082; not yet timed on a GPU).
        return LaunchConfig(32, 32, 8, 2) if head_dim_pad <= 64 else LaunchConfig(16, 16, 4, 2)
    if head_dim_pad <= 64:
        return LaunchConfig(64, 64, 4, 3)
    if head_dim_pad <= 128:
        if heavy_score:
            return LaunchConfig(32, 64, 4, 3)
        # Measured on the H200: 64 x 128 with 8 warps and TMA loads (see
        # `gpu_tma`), 336-396 TFLOP/s at d128.
        return LaunchConfig(64, 64, 4, 2) if short_rows else LaunchConfig(64, 128, 8, 3)
    if head_dim_pad > 256:  # MLA's 576-wide K (1024-wide tiles; not yet measured)
        return LaunchConfig(16, 16, 8, 1)
    if not wide and v_dim_pad is not None and v_dim_pad <= 128:
        # MLA's 192 / 128: 32 x 64 with 4 warps took 4.02 ms against 14.39 for
        # 32 x 32 x 8 x 2 (the sweep of `gpu_config`; 12 candidates, the next
        # best 5.49 ms at 64 x 64 x 8 x 2).
        return LaunchConfig(32, 64, 4, 2)
    return LaunchConfig(16 if wide else 32, 16 if wide else 32, 8, 1 if wide else 2)


def gpu_tma(head_dim_pad: int, dtype: ir.DType) -> tuple[bool, bool]:
    """Whether (forward, backward) load tiles through TMA descriptors by default.

    Measured on the H200 (BENCHMARKS.md, sweep 3): TMA made the forward 2-10%
    slower at d64 and no faster at d128, and the backward 4-6% faster at d128
    and slightly slower at d64.  A TMA box is at most 256 elements wide, so
    tiles wider than that (MLA's 576) load through pointers.
    """
    return False, 128 <= head_dim_pad <= 256 and dtype is not ir.DType.FP32


def gpu_decode_configs(head_dim_pad: int, dtype: ir.DType) -> tuple[LaunchConfig, ...]:
    """Split-KV decoding's launches (decision 052), one per tile of query rows:
    a call takes the first whose block_m holds its rows (its own tile is its
    rows rounded up to a power of two), and the last holds the largest tile
    (`DECODE_MAX_ROWS`).  block_n is the key tile.  Decoding streams K and V
    once, so the stages keep several key tiles in flight; fp32 and d256 get
    narrower key tiles for their registers, fp32 also 8 warps at 64 rows.

    Swept on the H200 (scripts/gpu_decode_sweep.py, 2026-12-03, decision 063,
    CUDA-graph replays, bf16, Nq = 1): at d128 GQA 32/8, 64 keys with 4 warps
    and 3 stages was the fastest of six at 1 x 128k, 8 x 32k and 32 x 8k,
    contiguous (3.82-4.25 TB/s) and paged (pages of 16 and 64: 0.96-0.98x
    contiguous, from 0.94-0.95x at 4 stages).

    The absorbed 576 / 512 latent (decision 064): at its 16-row tiles (16
    heads, one KV head, Nq = 1) 32 keys with 4 warps and 3 stages took 0.069,
    0.044 and 0.092 ms at 1 x 32k, 8 x 8k and 32 x 8k against 0.081, 0.072
    and 0.215 for 16 x 8 x 2; 64 x 4 x 2 was as fast or faster but spills
    436 B on sm_90a as a paged cache's tile (5 stages there: no spills).
    Tiles of 32 and 64 rows keep 16 x 8 x 2: the faster candidates spill 6-10
    KB there, or need more than 227 KB of shared memory."""
    if head_dim_pad > 256:  # MLA's absorbed 576-wide latent
        return LaunchConfig(16, 32, 4, 3), LaunchConfig(64, 16, 8, 2)
    if dtype is ir.DType.FP32:
        # 64 x 32 x 4 x 3 spilled 1-9 KB per thread at 64 rows (d64-d256) and
        # 0.7-6 KB at 16 rows from d128 on sm_90a; these spill nothing at d64
        # and d128 and at most 3 KB above (scripts/sm90_resources.py, decision
        # 082; not yet timed on a GPU).
        return LaunchConfig(16, 32 if head_dim_pad <= 64 else 16, 4, 3), LaunchConfig(64, 16, 8, 2)
    if head_dim_pad > 128:
        return (LaunchConfig(64, 32, 4, 3),)
    return (LaunchConfig(64, 64, 4, 3),)


# The Gluon forward for any mask and score ("any" below) against the Triton
# forward on the same spec (docs/decisions/029; d128, bf16): 0.84-0.99x
# at N = 1024, 1.02-1.07x at N = 4096 and 16384 when a query row sees
# thousands of keys, 0.85-0.91x for a 257-key band at every N.  It runs when


# The Triton interpreter runs each program instance in numpy: bigger tiles mean
# fewer Python-level steps.
CPU_CONFIG = LaunchConfig(32, 32, 1, 1)
