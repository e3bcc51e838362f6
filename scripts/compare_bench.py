"""Speed of one `flashgen bench` run against another on the same points: the
ratio of TFLOP/s (forward, and forward + backward) point by point, and their
geometric mean, smallest and largest per head dim.  Input: the files that
scripts/gpu_before_after.sh writes (one JSON list of measurements per line),
or `flashgen bench --json` files.

    python scripts/compare_bench.py BASE HEAD    # ratios HEAD / BASE
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def load(path: str) -> dict[tuple, dict]:
    """(variant, system, head dim, N) -> measurement, flashgen's alone."""
    points = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            for m in json.loads(line):
                if m["system"] == "flashgen" and not m["error"]:
                    points[(m["variant"], m["head_dim"], m["seqlen"])] = m
    return points


def main() -> int:
    base, head = load(sys.argv[1]), load(sys.argv[2])
    ratios: dict[tuple, list[float]] = {}
    print(f"{'variant':<16} {'d':>4} {'N':>6}   fwd TFLOP/s base -> head   fwd+bwd base -> head")
    for key in sorted(base.keys() & head.keys()):
        b, h = base[key], head[key]
        cells = []
        for direction in ("fwd_tflops", "bwd_tflops"):
            x, y = b[direction], h[direction]
            if x and y:
                ratios.setdefault((key[1], direction), []).append(y / x)
                cells.append(f"{x:6.0f} -> {y:6.0f} ({y / x:4.2f})")
            else:
                cells.append(f"{'-':>23}")
        print(f"{key[0]:<16} {key[1]:>4} {key[2]:>6}   " + "   ".join(cells))
    for (d, direction), values in sorted(ratios.items()):
        mean = math.exp(sum(map(math.log, values)) / len(values))
        print(
            f"d{d} {direction[:3]}{'' if direction == 'fwd_tflops' else '+bwd'}: "
            f"geomean {mean:.3f}, min {min(values):.3f}, max {max(values):.3f} "
            f"over {len(values)} points"
        )
    missing = sorted(base.keys() ^ head.keys())
    if missing:
        print(f"only in one run: {missing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
