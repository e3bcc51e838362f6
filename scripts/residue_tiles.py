"""Tiles a key loop visits over positions, against tiles over residue classes.

Congruence masks such as `causal & (q - k) % 4 == 0` make every tile of
positions partial: each holds visible pairs and hidden ones, so each is
computed whole and masked per element.  Split the queries and the keys by
position mod n, and each (query class, key class) pair sees a sub-lattice on
which the congruence is constant: its tiles are empty or not masked by it.
This counts, from the dense mask (head 0, Nq = Nk = N), the non-empty and the
partial tiles of BLOCK x BLOCK over positions and over the n x n class pairs'
sub-lattices (decision 084).  CPU only.

    python3 scripts/residue_tiles.py [--n-ctx 4096] [--block 64]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import torch  # noqa: E402

from flashgen.api import _check_specs  # noqa: E402
from flashgen.bench import draw_variants  # noqa: E402
from flashgen.printer import print_expr  # noqa: E402
from flashgen.reference import mask_matrix  # noqa: E402

# (name, spec text or (seed, index) of a drawn spec at d128, the modulus).
SPECS = (
    (
        "every 4th earlier key",
        "attention a { head_dim = 64; dtype = bf16; mask = causal & (q - k) % 4 == 0 }",
        4,
    ),
    ("rand0_3", (0, 3), 2),
    ("rand0_14", (0, 14), 2),
    ("rand0_25", (0, 25), 5),
)


def tile_counts(mask: torch.Tensor, block: int) -> tuple[int, int]:
    """Non-empty and partial tiles of a boolean matrix, padded with hidden pairs."""
    rows, cols = (-(-x // block) * block for x in mask.shape)
    padded = torch.zeros(rows, cols, dtype=torch.bool)
    padded[: mask.shape[0], : mask.shape[1]] = mask
    tiles = padded.reshape(rows // block, block, cols // block, block).permute(0, 2, 1, 3)
    visible = tiles.reshape(rows // block, cols // block, -1).sum(-1)
    return int((visible > 0).sum()), int(((visible > 0) & (visible < block * block)).sum())


def residue_counts(mask: torch.Tensor, n: int, block: int) -> tuple[int, int]:
    """tile_counts summed over the n x n class pairs' sub-lattices."""
    total = partial = 0
    for rq in range(n):
        for rk in range(n):
            a, b = tile_counts(mask[rq::n, rk::n], block)
            total, partial = total + a, partial + b
    return total, partial


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--block", type=int, default=64)
    args = parser.parse_args()
    for name, spec, n in SPECS:
        if isinstance(spec, str):
            variant = _check_specs(spec)[0]
        else:
            variant = draw_variants(spec[1] + 1, spec[0], 128)[spec[1]].variant
        mask = mask_matrix(variant, args.n_ctx, args.n_ctx, 1)[0]
        tiles, partial = tile_counts(mask, args.block)
        r_tiles, r_partial = residue_counts(mask, n, args.block)
        print(
            f"{name} (mask {print_expr(variant.mask)}, density {mask.float().mean():.3f}): positions "
            f"{tiles} tiles, {partial} partial; classes mod {n}: {r_tiles} tiles, {r_partial} "
            f"partial ({r_tiles / tiles:.2f} of the tiles)"
        )


if __name__ == "__main__":
    main()
