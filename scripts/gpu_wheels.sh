#!/usr/bin/env bash
# The wheels that scripts/gpu_env.sh installs on a GPU machine without a
# package index: lark, black (pinned as in pyproject.toml) and the parts of
# black's dependencies that machine's image lacks, for its Python (3.12,
# x86-64).  Run here, where the index is; .whl/ is git-ignored, so a device
# call must carry it (run's `carry: [".whl"]`).
#   bash scripts/gpu_wheels.sh [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-3.12}
black=$(grep -o '"black==[^"]*"' pyproject.toml | tr -d '"')
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
  -d .whl lark "$black" pytokens platformdirs pathspec mypy_extensions
ls .whl
