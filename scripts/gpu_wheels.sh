#!/usr/bin/env bash
# The wheels that scripts/gpu_env.sh installs on a GPU machine without a
# package index: flashgen's own dependencies other than torch and triton
# (lark, platformdirs, rich and rich's markdown-it-py, mdurl and pygments;
# jinja2 comes with torch), and black (pinned as in pyproject.toml) with the
# parts of its dependencies that machine's image lacks, for its Python (3.12,
# x86-64).  Run here, where the index is; .whl/ is git-ignored, so a device
# call must carry it (run's `carry: [".whl"]`).  .whl/hf/ holds transformers
# and its dependencies but numpy (about 28 MB) for scripts/gpu_stack.sh, which
# installs them with pip's resolver, so only what that machine lacks.
#   bash scripts/gpu_wheels.sh [PYTHON_VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-3.12}
black=$(grep -o '"black==[^"]*"' pyproject.toml | tr -d '"')
# The ranges of pyproject.toml's dependencies, so that the wheels are ones a
# pip install of flashgen could pick.
range() { grep -o "\"$1[>=<][^\"]*\"" pyproject.toml | tr -d '"'; }
rm -rf .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any \
  -d .whl "$(range lark)" "$(range platformdirs)" "$(range rich)" markdown-it-py mdurl \
  pygments "$black" pytokens pathspec mypy_extensions
ls .whl
transformers=$(grep -o '"transformers[>=<][^"]*"' pyproject.toml | tr -d '"')
python3 -m pip download -q --only-binary=:all: --python-version "$python" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any -d .whl/hf "$transformers"
rm -f .whl/hf/numpy-*.whl
ls .whl/hf
