"""Speed of one `flashgen bench` run against another on the same points: the
ratio of TFLOP/s (forward, and forward + backward) point by point, and their
geometric mean, smallest and largest per head dim.  Points where either run's
forward + backward went at the host's pace (marked h, as `flashgen bench`
marks them) measure Python and launch overhead, not kernels: the summary
counts them apart.  Input: the files that
scripts/gpu_before_after.sh writes (one JSON list of measurements per line),
or `flashgen bench --json` files.

    python scripts/compare_bench.py BASE HEAD    # ratios HEAD / BASE
"""

from __future__ import annotations

import json
import math

HOST_PACED = 0.9  # as flashgen.bench.HOST_PACED
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


def host_paced(m: dict) -> bool:
    both = (m["fwd_ms"] or 0) + (m["bwd_ms"] or 0)
    return m.get("host_ms") is not None and m["host_ms"] >= HOST_PACED * both


def main() -> int:
    base, head = load(sys.argv[1]), load(sys.argv[2])
    ratios: dict[tuple, list[float]] = {}
    print(f"{'variant':<16} {'d':>4} {'N':>6}   fwd TFLOP/s base -> head   fwd+bwd base -> head")
    for key in sorted(base.keys() & head.keys()):
        b, h = base[key], head[key]
        paced = host_paced(b) or host_paced(h)
        cells = []
        for direction in ("fwd_tflops", "bwd_tflops"):
            x, y = b[direction], h[direction]
            if x and y:
                kind = "host-paced" if paced and direction == "bwd_tflops" else "kernels"
                ratios.setdefault((key[1], direction, kind), []).append(y / x)
                mark = "h" if kind == "host-paced" else " "
                cells.append(f"{x:6.0f} -> {y:6.0f} ({y / x:4.2f}){mark}")
            else:
                cells.append(f"{'-':>24}")
        print(f"{key[0]:<16} {key[1]:>4} {key[2]:>6}   " + "  ".join(cells))
    for (d, direction, kind), values in sorted(ratios.items()):
        mean = math.exp(sum(map(math.log, values)) / len(values))
        print(
            f"d{d} {'fwd' if direction == 'fwd_tflops' else 'fwd+bwd'} ({kind}): "
            f"geomean {mean:.3f}, min {min(values):.3f}, max {max(values):.3f} "
            f"over {len(values)} points"
        )
    missing = sorted(base.keys() ^ head.keys())
    if missing:
        print(f"only in one run: {missing}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
