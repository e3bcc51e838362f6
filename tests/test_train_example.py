"""examples/train_gpt.py, the nanoGPT-style comparison of flashgen's causal
attention with SDPA, run tiny on the CPU (the kernels under the interpreter):
both runs start from the same weights and data, so their first losses agree
to float32 rounding, and every loss is finite."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_gpt.py"


@pytest.mark.kernels
def test_train_gpt_runs_both_attentions_from_the_same_start(tmp_path):
    spec = importlib.util.spec_from_file_location("train_gpt", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    record = tmp_path / "run.jsonl"
    summary = example.main(
        "--steps 4 --batch 2 --length 24 --vocab 16 --layers 1 --heads 2 --head-dim 16 "
        f"--dtype fp32 --device cpu --log-every 1 --jsonl {record}".split()
    )
    first = summary["first_loss"]
    assert abs(first[0] - first[1]) < 1e-5 * first[1]
    assert math.isclose(first[0], math.log(16), rel_tol=0.2)  # an untrained model: ~uniform
    (line,) = record.read_text().splitlines()
    losses = json.loads(line)["losses"]
    assert len(losses["flashgen"]) == len(losses["sdpa"]) == 4
    assert all(math.isfinite(x) for run in losses.values() for x in run)
    assert summary["max_abs_loss_difference"] < 1e-3
