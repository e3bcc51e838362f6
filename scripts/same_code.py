"""Whether the generated modules' code is unchanged since a commit, up to
formatting: every top-level function and class of generated/*.py compared as
Python syntax trees (comments, line breaks and redundant parentheses do not
count; docstrings do).  A refactor of the lowering or the templates that
passes this changes no kernel, so it needs no new GPU run for correctness.

    python scripts/same_code.py BASE_COMMIT    # exit 1 if any function differs
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


def definitions(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    return {
        node.name: ast.dump(node)
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
    }


def main() -> int:
    base = sys.argv[1]
    changed = 0
    for path in sorted(Path("generated").glob("*.py")):
        old = subprocess.run(
            ["git", "show", f"{base}:{path.as_posix()}"], capture_output=True, text=True
        )
        if old.returncode:
            print(f"{path.name}: not in {base}")
            changed += 1
            continue
        before, after = definitions(old.stdout), definitions(path.read_text())
        differ = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
        print(
            f"{path.name}: {len(after)} definitions, " + (f"differ: {differ}" if differ else "same")
        )
        changed += bool(differ)
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
