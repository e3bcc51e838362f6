#!/usr/bin/env bash
# Fresh machine to a working flashgen: create .venv, install flashgen with its
# test extras (a real, non-editable install), then run the demo: build
# examples/bloom_alibi.attn (or the spec given as $1), run its kernel once and
# print its max error against the dense float64 reference.  Without a GPU the
# kernel runs on the CPU under the Triton interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."

"${PYTHON:-python3}" -m venv .venv
# torch pinned first: 2.13.0 is the CPU build on this machine's disk; left to
# resolve flashgen's `torch>=2.4` alone, pip would fetch a multi-GB CUDA build.
# Triton 3.6.0: the version the kernels are GPU-tested with (any of flashgen's
# range works; TRITON=3.9.0 bash scripts/setup.sh installs another).
.venv/bin/python -m pip install --progress-bar off torch==2.13.0 "triton==${TRITON:-3.6.0}" ".[test]"
.venv/bin/python -m flashgen.demo "${1:-examples/bloom_alibi.attn}"
