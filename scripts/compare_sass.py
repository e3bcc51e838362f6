"""Two trees of PTX from `scripts/sm90_resources.py --ptx DIR`, compared as the
GPU would run them: each file present in both is assembled for sm_90a by the
ptxas that Triton ships, disassembled by its cuobjdump, and its instructions
compared with their addresses and encodings left out and the offsets of
kernel parameters in constant bank 0 written alike (a kernel that gained an
unused parameter reads the others at other offsets).  One line per kernel:

    same                 the same instructions in the same order
    same opcodes, N ...  the same operations in the same order, N of them on
                         other registers (register allocation)
    N of M differ        N instructions added, removed or reordered

For "the dense kernels are unchanged" without a GPU: build the tree of the
change and of its base (`git archive BASE | tar -x -C .base`), then

    python3 scripts/sm90_resources.py examples/full.attn --head-dim 128 --ptx /tmp/new
    (cd .base && PYTHONPATH=. python3 scripts/sm90_resources.py examples/full.attn \\
        --head-dim 128 --ptx /tmp/old)
    python3 scripts/compare_sass.py /tmp/new /tmp/old
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_PARAM = re.compile(r"c\[0x0\]\[0x[0-9a-f]+\]")


def sass(ptx_path: str) -> list[str]:
    """The instructions of one PTX file as sm_90a SASS, parameter offsets written alike."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sm90_resources import _ptxas

    cuobjdump = os.path.join(os.path.dirname(_ptxas()), "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        subprocess.run(
            [_ptxas(), "-arch=sm_90a", ptx_path, "-o", cubin], check=True, capture_output=True
        )
        out = subprocess.run(
            [cuobjdump, "-sass", cubin], check=True, capture_output=True, text=True
        ).stdout
    found = (_INSTRUCTION.match(line) for line in out.splitlines())
    return [_PARAM.sub("c[param]", m.group(1)) for m in found if m]


def compare(a: list[str], b: list[str]) -> str:
    if a == b:
        return "same"
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    changes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    differ = sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in changes)
    if [i.split()[0] for i in a] == [i.split()[0] for i in b]:
        return f"same opcodes, {differ} of {len(a)} with other operands (registers)"
    return f"{differ} of {len(a)} differ"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("new")
    parser.add_argument("old")
    args = parser.parse_args(argv)
    new = {p.relative_to(args.new): p for p in Path(args.new).rglob("*.ptx")}
    old = {p.relative_to(args.old): p for p in Path(args.old).rglob("*.ptx")}
    for name in sorted(new.keys() & old.keys()):
        print(f"{str(name):60} {compare(sass(str(new[name])), sass(str(old[name])))}")
    for name in sorted(new.keys() ^ old.keys()):
        print(f"{str(name):60} only in {args.new if name in new else args.old}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
