"""Register spills of the generated kernels on Hopper, checked without a GPU.

Triton compiles for a named target and ships ptxas, so the sm_90a resource
use of a kernel is known on any machine (scripts/sm90_resources.py, run here
in a process of its own: the tests interpret kernels, the script compiles
them).  Spills in an inner loop cost several percent
(docs/decisions/012-register-spills-without-gpu.md): the kernels that compile without them today must keep doing so.  Not a
timing test: the numbers are a property of the code and the pinned Triton.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import triton

from flashgen import api
from flashgen.emit import TESTED_TRITON

ROOT = Path(__file__).resolve().parent.parent
# Modules turn their Gluon kernels on only with the Triton they were tested
# with (3.6.x: Gluon's API changes between releases, and 3.9's does not compile
# them); elsewhere they have none to compile, and sm90_resources.py skips them.
HAS_GLUON = triton.__version__.startswith(TESTED_TRITON)
needs_gluon = pytest.mark.skipif(
    not HAS_GLUON,
    reason="modules enable their Gluon kernels only on Triton "
    + ", ".join(f"{prefix}x" for prefix in TESTED_TRITON)
    + f", not {triton.__version__}",
)
# The 16-bit examples; custom is float32 (CUDA-core products), which spills
# at its current tiles (decision 012); deepseek_mla's two head dims are compiled
# at their own values (test_mla_kernels_compile_for_sm90), not swept to 64 and 128.
SPECS = sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "examples").glob("*.attn")
    if path.stem not in ("custom", "deepseek_mla")
)
# The specs whose modules have split-KV decoding (decision 052: those that read
# no runtime data) and a per-call tile plan (masks that read inputs).
_SOURCES = {spec: api.build_source(ROOT / spec) for spec in SPECS}
DECODE_SPECS = [spec for spec in SPECS if "def _attn_decode(" in _SOURCES[spec]]
PLAN_SPECS = [spec for spec in SPECS if "def _attn_plan(" in _SOURCES[spec]]
# The specs whose tile plan finds packed documents' runs (decisions 110-111).
RUNS_SPECS = [spec for spec in SPECS if "def _runs_write_kernel(" in _SOURCES[spec]]
# Backward kernels free of spills at their tiles today.  (encoder_band at
# d128 runs the tiles `flashgen tune` measured fastest, (64, 64, 4, 2), which
# spill 112 B and still beat the spill-free ones by 43%: BENCHMARKS.md, 14.)
SPILL_FREE_BACKWARD = {("full", 128), ("full", 64), ("plain_causal", 64), ("encoder_band", 64)}
# Backwards that sum the gradients of learnable reads take spill-free tiles at
# d64 (decision 086: CUDA 12.8's ptxas assembled the spilling t5_relative_bias
# backward wrong on the H100).  At d128 they take 64 x 128 x 8 x 2, which
# spills 2.7 KB and was right for every form of learnable read on the H100.
SPILL_FREE_BACKWARD |= {("t5_relative_bias", 64)}
# The modules with a warp-specialized Gluon forward (`kernel_choice.gluon_forward`):
# its own code for full and causal, and its mode for any other mask at d128
# whose rows may see 4096 keys (not encoder_band's 257-key band; gemma2_local
# since decision 083, its rescale threshold no longer keeping it off; paligemma_prefix,
# built here at d128, since decision 098: a mask over data that documents do not bound).
# llama3_packed_docs: its plan's runs take plain causal's kernels (decision 109).
GLUON = {(name, d) for name in ("full", "plain_causal", "llama3_packed_docs") for d in (64, 128)}
GLUON_ANY = {
    (name, 128)
    for name in (
        "bloom_alibi", "gemma2_local", "llama4_local", "mistral_sliding", "prefix_lm",
        "paligemma_prefix",
    )
}  # fmt: skip
# Every 16-bit module at d64 and d128 has the Gluon backward's two kernels
# (`kernel_choice.gluon_backward`).  Its dQ kernel is free of spills, and so is its
# dK/dV kernel at d64; at d128 the dK/dV consumers (two accumulators of
# 64 x 128 in fp32 each) spill 24-232 B today.
# Specs that read inputs take it at d64 where the mask alone reads them
# (decision 078: paligemma_prefix); the packed documents at d64 and d128 carry
# plain causal's for their plan's runs instead of their own (decision 109),
# without the 12 B its own d64 dK/dV kernel spilled.
GLUON_BACKWARD = {
    (Path(spec).stem, d) for spec in SPECS if "_INPUTS = (" not in _SOURCES[spec] for d in (64, 128)
} | {("llama3_packed_docs", 64), ("llama3_packed_docs", 128), ("paligemma_prefix", 64)}
GLUON_BACKWARD_SPILLS = {}

# The kernels tier: the compiles take minutes.
pytestmark = pytest.mark.kernels


def _sm90_resources(*args: str) -> tuple[list[dict], str]:
    """scripts/sm90_resources.py's JSON rows for `args`, compiled (not
    interpreted) in a process of its own, and its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "scripts/sm90_resources.py", *args, "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    # Rows are JSON objects; a ptxas crash's report (decision 067) may print PTX.
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"')]
    return rows, out.stdout


def _compiled_once(tmp_path_factory, name: str, compile_rows) -> list[dict]:
    """compile_rows()'s rows, computed by one pytest-xdist worker for all of
    them (the compiles take minutes of a CPU each): the first to get here
    compiles and writes them, the others wait for the file."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, which every worker shares
    done, lock = root / f"{name}.json", root / f"{name}.lock"
    try:
        os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:  # another worker compiles
        deadline = time.monotonic() + 1800
        while not done.exists():
            assert time.monotonic() < deadline, f"no {done} after 30 minutes"
            time.sleep(1)
        result = json.loads(done.read_text())
        assert "error" not in result, result.get("error")
        return result["rows"]
    try:
        result = {"rows": compile_rows()}
    except BaseException as e:
        result = {"error": f"the compiling worker failed: {type(e).__name__}: {e}"[:4000]}
        raise
    finally:
        partial = done.with_suffix(".partial")
        partial.write_text(json.dumps(result))
        partial.rename(done)
    return result["rows"]


def _example_resources() -> list[dict]:
    # Two processes, half the specs each: a CPU each instead of one for all.
    halves = [SPECS[0::2], SPECS[1::2]]
    with concurrent.futures.ThreadPoolExecutor(len(halves)) as pool:
        parts = list(
            pool.map(lambda specs: _sm90_resources(*specs, "--head-dim", "64", "128"), halves)
        )
    rows = [row for part_rows, _ in parts for row in part_rows]
    stdout = "".join(part_stdout for _, part_stdout in parts)
    # Forward and backward per spec and head dim, split-KV decoding's kernel at
    # two tiles, on paged caches at two tiles, and its merge, the plan kernel
    # twice, the Gluon forwards (full and causal at d64 and d128, the rest at
    # d128), the two Gluon backward kernels (none where modules leave Gluon
    # off), and the four kernels that find packed documents' runs, twice.
    expected = 2 * 2 * len(SPECS) + 5 * 2 * len(DECODE_SPECS) + 2 * 2 * len(PLAN_SPECS)
    expected += 8 * 2 * len(RUNS_SPECS)
    if HAS_GLUON:
        expected += len(GLUON | GLUON_ANY) + 2 * len(GLUON_BACKWARD)
    assert len(rows) == expected, stdout[-2000:]
    return rows


@pytest.fixture(scope="module")
def resources(tmp_path_factory) -> list[dict]:
    return _compiled_once(tmp_path_factory, "sm90_example_resources", _example_resources)


# Forward kernels known to spill at their derived tiles.  t5_relative_bias
# (2026-12-02): T5's bucket expression, gathered per element on the tiles near the
# diagonal, spills 204 B at (64, 64, 4, 3); 8 warps at 64 x 64 spills none
# (`scripts/sm90_resources.py examples/t5_relative_bias.attn --forward-config 64 64 8 3`),
# not yet timed on a GPU against the spilling tiles.
SPILLING_FORWARD = {"t5_relative_bias"}


def test_forward_kernels_do_not_spill(resources):
    spilling = [
        r
        for r in resources
        if r["kernel"] == "_attn_fwd" and r["spill_stores"] and r["name"] not in SPILLING_FORWARD
    ]
    assert not spilling


def test_decode_kernels_do_not_spill(resources):
    """Split-KV decoding (decision 052) at 16 and 64 query rows, on paged KV
    caches (decisions 056, 062) at 64 rows with pages of 64 and at 16 with
    pages of 16, and its merge."""
    decode = [r for r in resources if r["kernel"].startswith("_attn_decode")]
    assert len(decode) == 5 * 2 * len(DECODE_SPECS)
    assert not [r for r in decode if r["spill_stores"]]


def test_backward_kernels_do_not_spill(resources):
    checked = [
        r
        for r in resources
        if r["kernel"] == "_attn_bwd" and (r["name"], r["head_dim"]) in SPILL_FREE_BACKWARD
    ]
    assert len(checked) == len(SPILL_FREE_BACKWARD)
    assert not [r for r in checked if r["spill_stores"]]


@needs_gluon
def test_gluon_forward_compiles_for_sm90_without_spills(resources):
    """Full and causal without spills; the mode for any mask with a few
    spilled registers today (0-20 B at maxnreg 168), none in the hundreds."""
    gluon = [r for r in resources if r["kernel"] == "_gluon_attn_fwd"]
    assert {(r["name"], r["head_dim"]) for r in gluon} == GLUON | GLUON_ANY
    assert not [r for r in gluon if (r["name"], r["head_dim"]) in GLUON and r["spill_stores"]]
    assert all(r["spill_stores"] <= 64 for r in gluon), gluon


@needs_gluon
def test_gluon_backward_compiles_for_sm90(resources):
    for kernel in ("_gluon_attn_bwd_dkdv", "_gluon_attn_bwd_dq"):
        found = [r for r in resources if r["kernel"] == kernel]
        assert {(r["name"], r["head_dim"]) for r in found} == GLUON_BACKWARD
    spilling = {
        (r["kernel"], r["name"], r["head_dim"]): r["spill_stores"]
        for r in resources
        if r["kernel"].startswith("_gluon_attn_bwd")
        and r["spill_stores"]
        and (r["kernel"] == "_gluon_attn_bwd_dq" or r["head_dim"] == 64)
    }
    assert spilling == GLUON_BACKWARD_SPILLS


@needs_gluon
def test_gluon_forward_for_any_mask_compiles_for_sm90():
    """The Gluon forward for any mask and score compiles for sm_90a with a
    window (mask bounds), ALiBi (a per-head argument) and a narrow band
    (forced on: `kernel_choice.GLUON_ANY_MIN_KEYS` keeps it out of encoder_band's
    module)."""
    specs = ["examples/mistral_sliding.attn", "examples/bloom_alibi.attn"]
    rows, stdout = _sm90_resources(*specs, "--gluon-forward-any")
    gluon = {r["name"]: r for r in rows if r["kernel"] == "_gluon_attn_fwd"}
    assert set(gluon) == {"mistral_sliding", "bloom_alibi"}, stdout[-2000:]
    # A few spilled registers today (8-48 B at maxnreg 168), none in the hundreds.
    assert all(r["spill_stores"] <= 64 for r in gluon.values()), gluon


@needs_gluon
def test_gluon_forward_at_head_dim_64_compiles_for_sm90():
    """The Gluon forward at head dim 64 (`kernel_choice.GLUON_FORWARD_HEAD_DIMS`
    extended to it, as scripts/gpu_gluon_d64.sh measures it): full, causal,
    a window with ALiBi and two masks whose Triton key loop splits (decision
    099: none, rand5_3; two, rand3_12) compile for sm_90a without spills."""
    split = ["rand5_3", "rand3_12"]
    examples = ["full", "plain_causal", "bloom_alibi"]
    specs = [f"examples/{n}.attn" for n in examples]
    specs += [f"benchmarks/specs/split_walk/{n}.attn" for n in split]
    rows, stdout = _sm90_resources(
        *specs, "--head-dim", "64", "--gluon-forward-head-dims", "64", "128", "--gluon-forward-any"
    )
    gluon = {r["name"]: r for r in rows if r["kernel"] == "_gluon_attn_fwd"}
    assert set(gluon) == {*examples, *split}, stdout[-2000:]
    assert all(r["head_dim"] == 64 and r["spill_stores"] == 0 for r in gluon.values()), gluon


DATA_MASKS = """\
attention packed_docs {
    head_dim = 128
    dtype = bf16
    doc: int32[B, Nk]
    mask = causal & doc[b, q] == doc[b, k]
}
attention prefix_per_example {
    head_dim = 64
    dtype = fp16
    prefix_len: int64[B]
    mask = causal | k < prefix_len[b]
}
attention reach_per_head {
    head_dim = 64
    dtype = bf16
    align = top_left
    t: int32[H]
    d: int32[B, Nk]
    mask = causal & k <= q + t[h] & d[b, k] >= d[b, q] - 1
}
attention batch_index {
    head_dim = 128
    dtype = fp16
    mask = causal | b == 1
}
"""


def test_kernels_of_masks_that_read_runtime_data_compile_for_sm90(tmp_path):
    """The interpreter does not type-check as the compiler does (a loop-carried
    variable whose shape changes runs there): the plan kernel and the
    forward and backward that read its plan compile for sm_90a."""
    spec = tmp_path / "data_masks.attn"
    spec.write_text(DATA_MASKS)
    rows, stdout = _sm90_resources(str(spec))
    assert "failed" not in stdout, stdout[-2000:]
    kernels = {(r["name"], r["kernel"]) for r in rows}
    names = ("packed_docs", "prefix_per_example", "reach_per_head", "batch_index")
    for kernel in ("_attn_fwd", "_attn_bwd", "_attn_plan"):
        assert {(name, kernel) for name in names} <= kernels, stdout[-2000:]
    if HAS_GLUON:  # the packed documents' runs, found by the plan (decisions 110-111)
        for kernel in ("_runs_count_kernel", "_runs_write_kernel", "_runs_finish_kernel"):
            assert ("packed_docs", kernel) in kernels, stdout[-2000:]


@needs_gluon
def test_gluon_forward_over_runtime_data_compiles_for_sm90(tmp_path):
    """Decision 098's knob: the any-mask Gluon forward walking a call's plan
    compiles for sm_90a at d128 for every mask over runtime data here (its
    consumers spilled 4-260 B, 2026-12-06)."""
    spec = tmp_path / "data_masks.attn"
    spec.write_text(DATA_MASKS)
    rows, stdout = _sm90_resources(
        str(spec), "--head-dim", "128", "--plan", "gluon_data_forward=on"
    )  # fmt: skip
    assert "failed" not in stdout, stdout[-2000:]
    gluon = {r["name"] for r in rows if r["kernel"] == "_gluon_attn_fwd"}
    assert gluon == {"packed_docs", "prefix_per_example", "reach_per_head", "batch_index"}, stdout


@needs_gluon
def test_gluon_forward_of_varlen_calls_compiles_for_sm90():
    """Decision 102's knob: the Gluon forward of varlen calls (VARLEN: a tile
    table, (tokens, heads * D) descriptors) compiles for sm_90a for full,
    causal and the any-mask kind, without spills (2026-12-06)."""
    specs = ["examples/full.attn", "examples/plain_causal.attn", "examples/mistral_sliding.attn"]
    args = ["--head-dim", "128", "--seqs", "--gluon-forward-any", "--plan", "gluon_varlen=on"]
    rows, stdout = _sm90_resources(*specs, *args)
    gluon = {r["name"]: r for r in rows if r["kernel"] == "_gluon_attn_fwd[varlen]"}
    assert set(gluon) == {"full", "plain_causal", "mistral_sliding"}, stdout[-2000:]
    assert all(r["spill_stores"] == 0 for r in gluon.values()), gluon


@needs_gluon
def test_gluon_backward_of_varlen_calls_compiles_for_sm90():
    """Decision 104's knob: the Gluon backward of varlen calls (VARLEN: the
    tile table, (tokens, heads * D) descriptors, statistics padded per
    sequence) compiles for sm_90a, dQ and dK/dV, for full, causal, a window
    with ALiBi at d128 and causal at d64; dQ without spills (the dK/dV
    consumers spill at d128 as the dense kernel does: 28-260 B, 2026-12-07)."""
    specs = ["examples/full.attn", "examples/plain_causal.attn", "examples/mistral_sliding.attn"]
    plan = ["--plan", "gluon_varlen=on", "gluon_varlen_backward=on"]
    rows, stdout = _sm90_resources(*specs, "--head-dim", "128", "--seqs", *plan)
    more, more_stdout = _sm90_resources(
        "examples/plain_causal.attn", "--head-dim", "64", "--seqs", *plan
    )
    rows, stdout = rows + more, stdout + more_stdout
    for kernel in ("_gluon_attn_bwd_dq[varlen]", "_gluon_attn_bwd_dkdv[varlen]"):
        found = {(r["name"], r["head_dim"]) for r in rows if r["kernel"] == kernel}
        assert len(found) == 4, (kernel, stdout[-2000:])
    assert all(r["spill_stores"] == 0 for r in rows if r["kernel"] == "_gluon_attn_bwd_dq[varlen]")


def test_kernels_of_padded_and_varlen_calls_with_sinks_and_offsets_compile_for_sm90():
    """The SEQS, HAS_SINKS and SHIFTED paths (decision 046) compile for sm_90a:
    ALiBi in fp16 (bloom_alibi) and a periodic mask with a score in fp32 (custom)."""
    rows, stdout = _sm90_resources("examples/bloom_alibi.attn", "examples/custom.attn", "--seqs")
    assert "failed" not in stdout, stdout[-2000:]
    kernels = {(r["name"], r["kernel"], r["tma"]) for r in rows}
    for name in ("bloom_alibi", "custom"):
        assert {(name, "_attn_fwd", False), (name, "_attn_bwd", False)} <= kernels, stdout


SEQUENCE_INPUTS = """\
attention prefix_per_example {
    head_dim = 64
    dtype = fp16
    prefix_len: int64[B]
    mask = causal | k < prefix_len[b]
}
attention t5_learned {
    head_dim = 64
    dtype = bf16
    rel: learnable fp32[H, 32]
    mask = causal
    score = s + rel[h, min(q - k, 31)]
}
"""


def test_kernels_with_inputs_in_padded_and_varlen_calls_compile_for_sm90(tmp_path):
    """Decision 051: a data-reading mask's plan per sequence and offset (SEQS
    and SHIFTED in `_attn_plan`), and the learnable dQ programs'
    sequence-moved dlse and slot count, compile for sm_90a."""
    spec = tmp_path / "sequence_inputs.attn"
    spec.write_text(SEQUENCE_INPUTS)
    rows, stdout = _sm90_resources(str(spec), "--seqs")
    assert "failed" not in stdout, stdout[-2000:]
    kernels = {(r["name"], r["kernel"], r["tma"]) for r in rows}
    for name in ("prefix_per_example", "t5_learned"):
        assert {(name, "_attn_fwd", False), (name, "_attn_bwd", False)} <= kernels, stdout
    assert ("prefix_per_example", "_attn_plan", False) in kernels, stdout


def test_mla_kernels_compile_for_sm90(tmp_path):
    """v_head_dim (decision 055) compiles for sm_90a: deepseek_mla (d192, v 128)
    free of spills at its tiles but the backward's, with TMA in the backward (v's
    and dO's boxes 128 wide, q's and k's 256).  Its backward at 32 x 64 x 4 x 2
    spills 572 B and took 4.02 ms on the H200 against 14.39 for the spill-free
    32 x 32 x 8 x 2; every faster candidate spilled (decision 063), as
    encoder_band's tuned tiles do (SPILL_FREE_BACKWARD).  DeepSeek's absorbed 576/512 latent within the H200's
    227 KB of shared memory per block (its backward and 64-row decode spill
    today: 16 x 16 tiles 1024 wide, not yet measured); its 16-row decode tiles,
    contiguous and paged, take a launch of their own free of spills (decision
    064: 64 x 4 x 2 was faster contiguous but spilled 436 B paged)."""
    spec = tmp_path / "latent.attn"
    spec.write_text(
        "attention deepseek_latent { head_dim = 576; v_head_dim = 512; dtype = bf16; mask = causal }"
    )
    rows, stdout = _sm90_resources("examples/deepseek_mla.attn", str(spec))
    assert "failed" not in stdout, stdout[-2000:]
    kernels = {(r["name"], r["kernel"]) for r in rows}
    for name in ("deepseek_mla", "deepseek_latent"):
        for kernel in ("_attn_fwd", "_attn_bwd", "_attn_decode", "_attn_decode_merge"):
            assert (name, kernel) in kernels, stdout[-2000:]
    mla = [r for r in rows if r["name"] == "deepseek_mla"]
    assert all(r["spill_stores"] == 0 for r in mla if r["kernel"] != "_attn_bwd"), stdout
    assert [r["tma"] for r in mla if r["kernel"] == "_attn_bwd"] == [True]
    assert all(r["shared"] <= 232448 for r in rows), stdout
    # v = k[..., :512]: the forward and decode read the latent's first 512 columns once.
    rows, stdout = _sm90_resources(str(spec), "--v-in-k")
    assert "failed" not in stdout, stdout[-2000:]
    assert {"_attn_fwd", "_attn_decode"} <= {r["kernel"] for r in rows}, stdout
    assert all(r["shared"] <= 232448 for r in rows), stdout
    narrow = [r for r in rows if r["kernel"].startswith("_attn_decode") and r["config"][0] == 16]
    assert len(narrow) == 2 and not [r for r in narrow if r["spill_stores"]], stdout


def test_drawn_specs_compile_for_sm90():
    """scripts/sm90_drawn.py: specs drawn from the whole language compile for
    sm_90a, every kernel of their modules (Gluon ones where the Triton in use
    enables them); one line per spec, exit 0."""
    assert _sm90_drawn("--first", "0", "--count", "3") == [["ok", "c0"], ["ok", "c1"], ["ok", "c2"]]


def _sm90_drawn(*args: str) -> list[list[str]]:
    """The first two words of each line of scripts/sm90_drawn.py ARGS (compiled,
    not interpreted), which must exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "scripts/sm90_drawn.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    return [line.split()[:2] for line in out.stdout.splitlines()]


def test_drawn_specs_over_runtime_data_compile_for_sm90():
    """scripts/sm90_drawn.py --inputs: specs that read runtime data (masks over
    integer inputs, scores over real ones, learnable or not) compile for sm_90a,
    the kernels of padded and varlen calls too; draw i is the same spec on every
    run, and the checker accepts it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import sm90_drawn
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from flashgen.printer import print_variant

    draws = [sm90_drawn.drawn_with_inputs(i) for i in range(8)]
    assert [print_variant(v) for v in draws] == [
        print_variant(sm90_drawn.drawn_with_inputs(i)) for i in range(8)
    ]
    assert all(v.inputs for v in draws)
    assert any(i.learnable for v in draws for i in v.inputs)
    assert any(not i.element.is_integer for v in draws for i in v.inputs)
    assert any(i.element.is_integer for v in draws for i in v.inputs)
    assert _sm90_drawn("--inputs", "--count", "2", "--seqs") == [["ok", "c0"], ["ok", "c1"]]


RESIDUE_CLASSES = """\
attention periodic_bottom_right {
    head_dim = 64
    dtype = bf16
    mask = causal & (q - k) % 4 == 0
}
attention periodic_top_left {
    head_dim = 64
    dtype = fp16
    mask = !causal & (q - k) % 4 == 1 | causal & (q - k) % 4 == 3
    align = top_left
}
"""


@pytest.mark.parametrize("seqs", [False, True], ids=["dense", "seqs"])
def test_residue_class_kernels_compile_for_sm90_with_arguments_of_one(tmp_path, seqs):
    """Decision 085's class kernels reassign the query count, the key count and
    the offsets per section; where Triton specializes a launch's 1 (Nq = 1,
    Nk = 1, one head, an offset of 1) as a constant, or the top-left offset is
    the literal 0, such a reassignment in a loop does not compile ("loop
    carried variable changed type"), which only the GPU showed (159c564's
    fix).  Compiled here for sm_90a with those parameters constant 1: a
    bottom-right mask of one section and a top-left one of two."""
    spec = tmp_path / "residue_classes.attn"
    spec.write_text(RESIDUE_CLASSES)
    ones = ["n_queries", "n_keys", "num_heads"] + (["q_shift", "k_shift"] if seqs else [])
    rows, stdout = _sm90_resources(str(spec), *(["--seqs"] if seqs else []), "--ones", *ones)
    # ptxas may crash on a pipelined loop at these constants and print why; the
    # script then compiles with fewer stages, as a module's launch does
    # (decision 067), and reports the kernel.  A spec that fails says "failed:".
    assert not re.search(r"^\S+\s+failed: ", stdout, re.M), stdout[-2000:]
    kernels = {(r["name"], r["kernel"]) for r in rows}
    for name in ("periodic_bottom_right", "periodic_top_left"):
        assert {(name, "_attn_fwd"), (name, "_attn_bwd")} <= kernels, stdout
