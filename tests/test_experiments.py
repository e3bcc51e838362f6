"""Plan knobs for experiments (flashgen/experiments.py): what each takes,
what it changes in a module, and that a module built with knobs still
computes the variant."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashgen import ir
from flashgen.emit import render_module
from flashgen.experiments import KNOBS, ExperimentError, parse_settings
from flashgen.launch import LaunchConfig
from flashgen.lower import lower
from flashgen.verify import check_forward

from kernel_utils import make_variant
from test_cli import run


def test_settings_parse_to_the_fields_values():
    values = parse_settings(
        ["gpu_config=128,64,8,2", "gpu_bwd_tma=on", "gluon_bwd_stages=2,2", "gluon_forward=off",
         "gluon_stages=2", "gluon_min_keys=0", "tanh_small_poly=on", "gluon_dq_heavy_last=false"]
    )  # fmt: skip
    assert values == {
        "gpu_config": LaunchConfig(128, 64, 8, 2),
        "gpu_bwd_tma": True,
        "gluon_bwd_stages": (2, 2),
        "gluon_forward": None,
        "gluon_stages": 2,
        "gluon_min_keys": 0,
        "tanh_small_poly": True,
        "gluon_dq_heavy_last": False,
    }


def test_every_problem_is_named_at_once():
    with pytest.raises(ExperimentError) as e:
        parse_settings(
            ["gluon_forward=on", "tanh_small_poly=off", "nope=1", "gpu_config=100,64,4,2",
             "gluon_stages=9", "gpu_tma=maybe", "gpu_tma=on", "gpu_tma=off", "bare"]
        )  # fmt: skip
    message = str(e.value)
    for part in [
        "gluon_forward=on: can only be set off",
        "tanh_small_poly=off: can only be set on",
        "'nope' is not a plan knob",
        "block_m must be a power of two >= 16, got 100",
        "gluon_stages=9: each must lie in [1, 4]",
        "gpu_tma=maybe: expected on or off",
        "'gpu_tma' is set twice",
        "'bare': expected NAME=VALUE",
    ]:
        assert part in message, part


def test_knobs_change_what_they_name():
    variant = make_variant("causal", dtype=ir.DType.BF16, head_dim=128)
    default = render_module(variant)
    assert "GLUON_STAGES = 3" in default and "def _gluon_backward(" in default
    knobs = parse_settings(["gluon_stages=2", "gluon_backward=off", "gpu_tma=off",
                            "gpu_config=64,32,4,1"])  # fmt: skip
    source = render_module(variant, None, knobs)
    assert "GLUON_STAGES = 2" in source
    assert "def _gluon_backward(" not in source and "_gluon_backward_supported" not in source
    assert "GPU_TMA = False" in source and "GPU_CONFIG = (64, 32, 4, 1)" in source
    assert "built with plan knobs gluon_stages=2, gluon_backward=off, gpu_tma=off" in source
    assert "plan knobs" not in default
    off = render_module(variant, None, parse_settings(["gluon_forward=off"]))
    assert "def _gluon_forward(" not in off and "def _attn_fwd(" in off


def _undefined_names(source: str) -> set[str]:
    """Names the module's code reads or calls that it does not define or import."""
    import ast
    import builtins

    tree = ast.parse(source)
    defined = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            defined.add(node.name)
    read = {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }
    return read - defined


@pytest.mark.parametrize(
    "mask, score",
    [("causal", "s"), ("window(300)", "log(1.0 + abs(s + alibi))"), ("full", "s * 0.5")],
)
@pytest.mark.parametrize("knobs", [[], ["gluon_backward=off"], ["gluon_forward=off"]])
def test_either_gluon_pass_builds_without_the_other(mask, score, knobs):
    """The any-mask Gluon forward calls the mask's key bounds and tile classes
    (`_gluon_key_cols`, `_gluon_tile_class`), which it shares with the Gluon
    backward: a module built with gluon_backward=off still defines them (its
    forward failed to compile on the GPU, NameError, 2026-12-02)."""
    variant = make_variant(mask, score=score, dtype=ir.DType.BF16, head_dim=128)
    source = render_module(variant, None, parse_settings(knobs))
    assert not _undefined_names(source)


# One setting of each knob away from its default (the modules it builds must
# define everything they call), and the --triton-only form.
KNOB_SETTINGS = [
    "gpu_config=32,32,4,2", "gpu_bwd_config=32,32,4,2", "gpu_tma=on", "gpu_tma=off",
    "gpu_bwd_tma=on", "gpu_bwd_tma=off", "gluon_forward=off", "gluon_backward=off",
    "gluon_stages=1", "gluon_bwd_stages=1,1", "gluon_min_keys=0", "gluon_dq_heavy_last=on",
    "gluon_dq_heavy_last=off", "tanh_small_poly=on", "fast_math=off", "gather_unpipelined=on",
    "hoist_reads=off", "merged_edges=on", "merged_edges=off", "heads_first=on",
    "bwd_heads_first=on", "seqs_tma=on", "branchless_tiles=on", "branchless_tiles=off",
    "classify_edge_tiles=off", "gluon_one_probs_call=flag", "gluon_one_probs_call=masked",
    "gluon_one_probs_call=off", "residue_classes=off", "residue_classes=on",
    "gluon_bwd_streams=64,128", "float_distances=on", "float_distances=off",
    "gluon_data_d128=on", "gluon_data_d128=off", "gluon_data_forward=on",
    "gluon_data_forward=off", "gluon_varlen=on", "gluon_varlen=off", "gluon_varlen_backward=on",
    "gluon_varlen_backward=off", "gluon_varlen_captured=on", "gluon_varlen_captured=off",
    "document_runs=on", "document_runs=off",
]  # fmt: skip


@pytest.mark.parametrize(
    "name",
    # The Gluon causal and any-mask forwards, runtime data, MLA, a learnable
    # table, tanh (softcap).
    ["plain_causal", "mistral_sliding", "llama3_packed_docs", "deepseek_mla", "t5_relative_bias",
     "gemma2_local"],
)  # fmt: skip
def test_every_knob_setting_builds_modules_that_define_what_they_read(name):
    from kernel_utils import example_variants

    assert {s.split("=")[0] for s in KNOB_SETTINGS} == set(KNOBS)
    (variant,) = [v for v in example_variants() if v.name == name]
    settings = list(KNOB_SETTINGS)
    if variant.name == "llama3_packed_docs":  # its plan's 64-row tiles (decision 078)
        with pytest.raises(ExperimentError, match="runtime data takes 64,64"):
            render_module(variant, None, parse_settings(["gluon_bwd_streams=64,128"]))
        settings.remove("gluon_bwd_streams=64,128")
    model = lower(variant)
    if not model.gluon_forward or model.inputs:  # decision 102
        with pytest.raises(ExperimentError, match="gluon_varlen: for a module with the Gluon"):
            render_module(variant, None, parse_settings(["gluon_varlen=on"]))
        settings.remove("gluon_varlen=on")
    for pair in (
        ["gluon_varlen=on", "gluon_forward=off"],
        ["gluon_varlen_backward=on", "gluon_backward=off"],
    ):
        with pytest.raises(ExperimentError, match="for a module with the Gluon"):
            render_module(variant, None, parse_settings(pair))
    if not model.gluon_backward or model.inputs:  # decision 104
        with pytest.raises(ExperimentError, match="gluon_varlen_backward: for a module with"):
            render_module(variant, None, parse_settings(["gluon_varlen_backward=on"]))
        settings.remove("gluon_varlen_backward=on")
    if not (model.gluon_varlen or model.gluon_varlen_backward):  # decision 107
        with pytest.raises(ExperimentError, match="gluon_varlen_captured: for a module whose"):
            render_module(variant, None, parse_settings(["gluon_varlen_captured=on"]))
        settings.remove("gluon_varlen_captured=on")
    with pytest.raises(ExperimentError, match="gluon_varlen_captured: for a module whose"):
        render_module(
            variant, None,
            parse_settings(["gluon_varlen_captured=on", "gluon_varlen=off", "gluon_varlen_backward=off"]),
        )  # fmt: skip
    builds = [(s, render_module(variant, None, parse_settings([s]))) for s in settings]
    builds.append(("--triton-only", render_module(variant, triton_only=True)))
    problems = {setting: sorted(_undefined_names(source)) for setting, source in builds}
    assert not {k: v for k, v in problems.items() if v}


def test_streamed_gluon_backward_tiles_set_the_descriptors_and_refuse_what_cannot_fit():
    """gluon_bwd_streams: the dK/dV kernel's Q and dO tiles and the dQ kernel's
    K and V tiles get descriptors of their own rows; 128 streamed rows of a
    128-wide head in the dK/dV kernel, or three 128-key buffers in the dQ
    kernel, would not fit shared memory, and a mask over runtime data keeps
    its plan's 64-row tiles."""
    narrow = make_variant("full", dtype=ir.DType.BF16, head_dim=64)
    assert "GLUON_BWD_STREAMS = (64, 64)" in render_module(narrow)
    source = render_module(narrow, None, parse_settings(["gluon_bwd_streams=128,128"]))
    assert "GLUON_BWD_STREAMS = (128, 128)" in source and not _undefined_names(source)
    assert "q_stream, k_desc, v_desc, do_stream, dk_desc, dv_desc" in source
    assert "q_desc, k_stream, v_stream, do_desc, dq_desc" in source
    wide = make_variant("causal", dtype=ir.DType.BF16, head_dim=128)
    assert "(64, 128)" in render_module(wide, None, parse_settings(["gluon_bwd_streams=64,128"]))
    for settings in (
        ["gluon_bwd_streams=128,64"],
        ["gluon_bwd_streams=64,128", "gluon_bwd_stages=3,3"],
    ):
        with pytest.raises(ExperimentError, match="at head dim 128"):
            render_module(wide, None, parse_settings(settings))
    with pytest.raises(ExperimentError, match="gluon_bwd_streams=96,64: each must be 64 or 128"):
        parse_settings(["gluon_bwd_streams=96,64"])


def test_wrong_dkdv_parts_are_refused_and_data_masks_take_the_gluon_backward_at_head_dim_128():
    """Decision 095: masked dK/dV tiles in parts (32 rows of 64, or 64 of 128
    streamed rows) gave wrong dK and dV on an H100: the parts are gone, and 128
    streamed dK/dV rows stay for a full mask, which has no masked tile.
    gluon_data_d128: a mask over runtime data takes the Gluon backward at
    head dim 128."""
    with pytest.raises(ExperimentError, match="'gluon_dkdv_parts' is not a plan knob"):
        parse_settings(["gluon_dkdv_parts=32"])
    causal = make_variant("causal", dtype=ir.DType.BF16, head_dim=64)
    with pytest.raises(ExperimentError, match="window.100, 60. on an H100, decision 095"):
        render_module(causal, None, parse_settings(["gluon_bwd_streams=128,128"]))
    full = make_variant("full", dtype=ir.DType.BF16, head_dim=64)
    source = render_module(full, None, parse_settings(["gluon_bwd_streams=128,128"]))
    assert "GLUON_BWD_STREAMS = (128, 128)" in source
    docs = make_variant(
        "causal & doc[b, q] == doc[b, k]", dtype=ir.DType.BF16, head_dim=128,
        declared="doc: int32[B, Nk]",
    )  # fmt: skip
    # Its own Gluon backward only with the knob (by default the module carries the
    # Gluon kernels of its positional part instead, decision 109).
    assert "def _gluon_backward(" not in render_module(
        docs, None, parse_settings(["document_runs=off"])
    )
    source = render_module(docs, None, parse_settings(["gluon_data_d128=on"]))
    assert "def _gluon_backward(" in source and "runs=None" not in source
    assert not _undefined_names(source)


def test_data_masks_take_the_any_mask_gluon_forward_unless_documents_bound_their_rows():
    """Decision 098: a mask over runtime data takes the any-mask Gluon forward
    where the any-mask kernel is built (d128), walking the call's plan: the
    module computes the plan of its consumers' 64-row tiles and tile_plan()
    builds it too.  By default not a mask whose plan bounds rows by documents
    (measured slower), and the knob gluon_data_forward decides either way.
    Not for a score that reads runtime data, and not at d64."""
    prefix = make_variant(
        "causal | k < prefix_len[b]", dtype=ir.DType.BF16, head_dim=128,
        declared="prefix_len: int32[B]",
    )  # fmt: skip
    assert "def _gluon_forward(" in render_module(prefix)
    source = render_module(prefix, None, parse_settings(["gluon_data_forward=off"]))
    assert "def _gluon_forward(" not in source
    docs = make_variant(
        "causal & doc[b, q] == doc[b, k]", dtype=ir.DType.BF16, head_dim=128,
        declared="doc: int32[B, Nk]",
    )  # fmt: skip
    # With document_runs (decision 109) the Gluon kernels of its positional part, for calls
    # whose ids form runs; without those, none.
    assert "def _gluon_forward(q, k, v, o, lse, scale: float, seqs=None, runs=None)" in (
        render_module(docs, None, parse_settings(["document_runs=on"]))
    )
    assert "def _gluon_forward(" not in render_module(
        docs, None, parse_settings(["document_runs=off"])
    )
    source = render_module(docs, None, parse_settings(["gluon_data_forward=on"]))
    assert "def _gluon_forward(q, k, v, o, lse, scale: float, inputs=(), plan=None)" in source
    assert "_data_plans(q, k, 64, 64, (True,), inputs, plan=plan)" in source
    assert "shapes.setdefault((64, 64), set()).add(True)" in source
    assert "_gluon_forward(q, k, v, o, lse, scale, inputs, plan)" in source
    assert not _undefined_names(source)
    # The batch index alone: a plan, and no inputs to pass on.
    batch = make_variant("causal | b == 1", dtype=ir.DType.FP16, head_dim=128)
    source = render_module(batch)
    assert "_gluon_forward(q, k, v, o, lse, scale, (), plan)" in source
    assert not _undefined_names(source)
    for variant in (
        dataclasses.replace(docs, head_dim=64),
        make_variant(
            "causal", "s + bias[b, k]", dtype=ir.DType.BF16, head_dim=128,
            declared="bias: fp32[B, Nk]",
        ),
    ):  # fmt: skip
        source = render_module(variant, None, parse_settings(["gluon_data_forward=on"]))
        assert "def _gluon_forward(" not in source


def test_every_knob_is_a_plan_field():
    from flashgen.experiments import _SECTION_KNOBS, LOWERING_KNOBS
    from flashgen.lower import KernelModel, TileSection

    fields = {f.name for f in KernelModel.__dataclass_fields__.values()}
    section_fields = {f.name for f in TileSection.__dataclass_fields__.values()}
    assert set(KNOBS) - LOWERING_KNOBS - _SECTION_KNOBS <= fields
    assert _SECTION_KNOBS <= section_fields and not _SECTION_KNOBS & fields
    assert LOWERING_KNOBS <= set(KNOBS) and not LOWERING_KNOBS & (fields | section_fields)


def test_residue_classes_off_walks_positions_and_says_so():
    variant = make_variant("causal & (q - k) % 4 == 1", dtype=ir.DType.BF16, head_dim=128)
    source = render_module(variant, None, parse_settings(["residue_classes=off"]))
    assert "RESIDUE_STEP" not in source and "residue_classes=off" in source
    assert "RESIDUE_STEP = 4" in render_module(variant)
    assert not _undefined_names(source)
    # Knobs of the plain grids and TMA loads do not combine with the classes.
    with pytest.raises(ExperimentError, match="heads_first.*residue_classes=off"):
        render_module(variant, None, parse_settings(["heads_first=on"]))
    render_module(variant, None, parse_settings(["heads_first=on", "residue_classes=off"]))


def test_loop_knobs_set_the_whole_masks_section_and_each_residue_section():
    from flashgen.experiments import apply
    from flashgen.lower import lower

    variant = make_variant("causal & (q - k) % 4 == 1", dtype=ir.DType.BF16, head_dim=128)
    model = lower(variant)
    assert model.residue_sections
    settings = ["merged_edges=off", "branchless_tiles=on", "classify_edge_tiles=off"]
    changed = apply(model, parse_settings(settings))
    for t in (changed.tiles, *changed.residue_sections):
        assert (t.merged_edges, t.branchless_tiles, t.classify_edge_tiles) == (False, True, False)
    assert changed.experiments == tuple(settings)


def test_a_module_built_with_knobs_computes_the_variant():
    """The accurate tanh switched on in a 16-bit softcap module (its plan
    had the cheaper one): the kernels still match the reference."""
    variant = make_variant("causal", score="softcap(s, 20.0)", dtype=ir.DType.FP16, head_dim=16)
    from flashgen.lower import lower

    assert not lower(variant).tanh_small_poly
    source = render_module(variant, None, parse_settings(["tanh_small_poly=on"]))
    module = type(torch)("flashgen_test_knobs")
    import sys

    sys.modules[module.__name__] = module
    try:
        exec(compile(source, "<knobs>", "exec"), module.__dict__)
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, n, 16, generator=gen).half() for n in (21, 37, 37))
        result = check_forward(variant, module, q, k, v)
    finally:
        del sys.modules[module.__name__]
    assert result.ok, result


@pytest.mark.kernels
@pytest.mark.parametrize(
    "knob", ["gather_unpipelined", "hoist_reads", "heads_first", "bwd_heads_first"]
)
def test_knobs_on_input_reads_compute_the_same_bits(knob):
    """gather_unpipelined moves every input read into an always-taken branch;
    hoist_reads (on by default) loads a score read once for a tile where its
    indices are constant over it; heads_first launches the forward's programs
    in another order (its plan row found from the grid's other axis), and
    bwd_heads_first the backward's (under GQA, where some of its programs
    have nothing to do).  Forward and backward give the same bits with the
    knob and without, on tiles on and off the diagonal and across documents."""
    from flashgen.check import check
    from flashgen.parse import parse

    text = (
        "attention t { head_dim = 16; dtype = fp32; rel: fp32[H, 32]; doc: int32[B, Nk];"
        " mask = causal & doc[b, q] == doc[b, k]; score = s + rel[h, min(q - k, 31)] }"
    )
    (variant,), _ = check([parse(text)[0]])
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, h, n, 16, generator=gen).requires_grad_()
        for h, n in ((2, 70), (1, 100), (1, 100))
    )
    data = dict(
        rel=torch.randn(2, 32, generator=gen),
        doc=(torch.arange(100) // 40).repeat(2, 1).to(torch.int32),
    )
    runs = []
    marker = {
        "gather_unpipelined": "if sizes[0] > 0:",
        "hoist_reads": "read0 = tl.zeros_like",
        "heads_first": "batch_head = tl.program_id(0)",
        "bwd_heads_first": "tile, tiles = tl.program_id(1), tl.num_programs(1)",
    }[knob]
    for setting in ("off", "on"):
        source = render_module(variant, None, parse_settings([f"{knob}={setting}"]))
        assert (marker in source) == (setting == "on")
        module = type(torch)(f"flashgen_test_{knob}_{setting}")
        import sys

        sys.modules[module.__name__] = module
        try:
            exec(compile(source, "<knobs>", "exec"), module.__dict__)
            o = module.attention(q, k, v, **data)
            runs.append((o, *torch.autograd.grad(o.square().sum(), (q, k, v))))
        finally:
            del sys.modules[module.__name__]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.kernels
@pytest.mark.parametrize(
    "mask, score",
    [
        ("full", "s + alibi"),  # |q - k|
        ("causal", "s + alibi"),  # k - q under the mask
        ("causal & (q - k) % 2 == 0", "s - 0.05 * abs(q - k)"),  # the custom example's
        ("window(40, 9)", "tanh(s * (k - q) * 0.01)"),  # a distance in the derivative too
    ],
)
def test_float_distances_compute_the_same_bits(mask, score):
    """float_distances (decision 094): the forward and the three gradients
    are the same bits with the knob and without, positions pushed past 2^23
    by offsets, with Nq != Nk."""
    variant = make_variant(mask, score=score, dtype=ir.DType.FP32, head_dim=16)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen).requires_grad_() for n in (37, 70, 70))
    runs = []
    for setting in ("off", "on"):
        source = render_module(variant, None, parse_settings([f"float_distances={setting}"]))
        assert ("k_pos.to(tl.float32)" in source) == (setting == "on")
        module = type(torch)(f"flashgen_test_float_distances_{setting}")
        import sys

        sys.modules[module.__name__] = module
        try:
            exec(compile(source, "<knobs>", "exec"), module.__dict__)
            o = module.attention(q, k, v, q_offset=9_000_000 + 33, k_offset=9_000_000)
            runs.append((o, *torch.autograd.grad(o.square().sum(), (q, k, v))))
        finally:
            del sys.modules[module.__name__]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.kernels
def test_heads_first_grids_in_varlen_calls_compute_the_same_bits():
    """heads_first and bwd_heads_first on a module without a document mask
    (the knobs a varlen measurement sets, scripts/gpu_varlen_bench.py --plan):
    the programs of a varlen call run in another order, sequences of 1 to 65
    rows among them (tiles past a sequence's end included), under GQA; the
    output and the gradients are the same bits."""
    from flashgen.check import check
    from flashgen.parse import parse

    text = "attention t { head_dim = 16; dtype = fp32; mask = causal }"
    (variant,), _ = check([parse(text)[0]])
    gen = torch.Generator().manual_seed(0)
    cu = torch.tensor([0, 5, 70, 71, 130], dtype=torch.int32)
    q, k, v = (torch.randn(130, h, 16, generator=gen).requires_grad_() for h in (2, 1, 1))
    runs = []
    for setting in ("off", "on"):
        knobs = parse_settings([f"heads_first={setting}", f"bwd_heads_first={setting}"])
        source = render_module(variant, None, knobs)
        assert ("batch_head = tl.program_id(0)" in source) == (setting == "on")
        module = type(torch)(f"flashgen_test_varlen_heads_first_{setting}")
        import sys

        sys.modules[module.__name__] = module
        try:
            exec(compile(source, "<knobs>", "exec"), module.__dict__)
            o = module.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu)
            runs.append((o, *torch.autograd.grad(o.square().sum(), (q, k, v))))
        finally:
            del sys.modules[module.__name__]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.kernels
@pytest.mark.parametrize(
    "mask, score, align",
    [
        ("causal & (q - k) % 4 == 0", None, "bottom_right"),  # the rule's own kind
        ("causal & (q - k) % 2 == 0", "s - 0.05 * abs(q - k)", "top_left"),  # the example
        ("(q - k) % 3 != 1 & k <= q + 5", "max(s, -1.0)", "bottom_right"),
        # Not the rule's: whole tiles and empty ones (32 x 32 squares on the
        # interpreter's 32 x 32 tiles), all of them run masked.
        ("(q div 32 + k div 32) % 2 == 0", None, "top_left"),
        ("max(q, k) % 30 < 15", None, "bottom_right"),
        # Masked loops around an interior that classify their tiles.
        ("causal | k >= q + 27", "s + 0.05 * h", "bottom_right"),
        ("max(q, k) > 37", None, "top_left"),
    ],
)
def test_branchless_tiles_compute_the_same_bits(mask, score, align):
    """branchless_tiles (decision 074): loops without an interior call the
    masked tile for every tile in their bounds, with no branch, and
    classify_edge_tiles=off does so in the masked loops around an interior.
    A masked tile computes a whole tile and an empty one right, so the knobs
    are correct for any mask: forward, lse and gradients give the same bits with
    it and without, Nq > Nk and Nq < Nk, rows and keys past a tile's end, and
    in split-KV decoding."""
    variant = make_variant(mask, score, head_dim=16, align=align)
    gen = torch.Generator().manual_seed(1)
    import sys

    knobs = (["branchless_tiles=off"], ["branchless_tiles=on", "classify_edge_tiles=off"])
    sources = [render_module(variant, None, parse_settings(k)) for k in knobs]
    assert sources[0] != sources[1]  # the knob reaches a loop of this mask

    for nq, nk in ((70, 45), (37, 100)):
        q, k, v = (
            torch.randn(2, h, n, 16, generator=gen).requires_grad_()
            for h, n in ((4, nq), (2, nk), (2, nk))
        )
        runs = []
        for setting, source in zip(("off", "on"), sources):
            module = type(torch)(f"flashgen_test_branchless_{setting}")
            sys.modules[module.__name__] = module
            try:
                exec(compile(source, "<knobs>", "exec"), module.__dict__)
                o, lse = module.forward(q.detach(), k.detach(), v.detach())
                # A few query rows without a gradient: split-KV decoding.
                decoded = module.forward(q.detach()[:, :, :3], k.detach(), v.detach())
                out = module.attention(q, k, v)
                grads = torch.autograd.grad(out.square().sum(), (q, k, v))
                runs.append((o, lse, *decoded, out, *grads))
            finally:
                del sys.modules[module.__name__]
        for a, b in zip(*runs):
            assert torch.equal(a, b)


def test_cli_build_takes_plan_knobs(capsys, tmp_path):
    spec = tmp_path / "x.attn"
    spec.write_text("attention x { head_dim = 64; dtype = fp16; mask = causal }\n")
    code, out, _ = run(capsys, "build", str(spec), "-o", str(tmp_path / "out"),
                       "--plan", "gpu_bwd_tma=off")  # fmt: skip
    assert code == 0
    text = (tmp_path / "out" / "x.py").read_text()
    assert "GPU_BWD_TMA = False" in text and "plan knobs gpu_bwd_tma=off" in text
    code, _, err = run(capsys, "build", str(spec), "-o", str(tmp_path / "o2"), "--plan", "gluon=1")
    assert code == 2 and "build: --plan: 'gluon' is not a plan knob" in err
    assert not (tmp_path / "o2").exists()
    # A knob the block's plan does not take: an error naming the block, no traceback.
    spec.write_text("attention x { head_dim = 64; dtype = fp16; mask = (q - k) % 2 == 0 }\n")
    code, _, err = run(capsys, "build", str(spec), "-o", str(tmp_path / "o3"), "--plan",
                       "seqs_tma=on")  # fmt: skip
    assert code == 2 and "--plan for 'x': seqs_tma: not for kernels that walk residue" in err
    assert "Traceback" not in err and not (tmp_path / "o3").exists()


def _module_with(variant, knobs: list[str], name: str):
    """The module of `variant` built with plan knobs, imported as `name`."""
    import sys

    source = render_module(variant, None, parse_settings(knobs))
    module = type(torch)(name)
    sys.modules[name] = module
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


@pytest.mark.kernels
@pytest.mark.parametrize("learned", [False, True])
@pytest.mark.parametrize("layout", ["varlen", "padded"])
def test_seqs_tma_loads_each_sequence_through_descriptors_with_the_same_bits(layout, learned):
    """seqs_tma (decision 072): a padded or varlen call's backward streams
    its tiles through TMA descriptors, each at its sequence's first row, and
    the tiles that may pass the sequence's end through pointers (which read
    zeros there): the same bits as pointer loads throughout,
    with infinite and NaN values in the padding and huge ones in the
    neighbouring sequences; with a learnable table, whose gradient's row
    terms load the key tiles too, its gradient as well."""
    import sys

    from flashgen.check import check
    from flashgen.parse import parse

    score = "s + rel[h, min(q - k, 7)]" if learned else "s - 0.1 * abs(q - k)"
    table = "rel: learnable fp32[H, 8]; " if learned else ""
    text = (
        f"attention t {{ head_dim = 16; dtype = fp16; {table}"
        f"mask = causal & !(window(5) & !causal); score = {score} }}"
    )
    (variant,), _ = check([parse(text)[0]])
    gen = torch.Generator().manual_seed(3)
    lengths = [(19, 40), (33, 7), (1, 1), (50, 45)]
    runs, descriptors = [], []
    for knobs in (["gpu_bwd_tma=on"], ["gpu_bwd_tma=on", "seqs_tma=on"]):
        name = f"flashgen_test_seqs_tma_{layout}_{len(knobs)}"
        module = _module_with(variant, knobs, name)
        real = module._descriptors

        def spy(use_tma, *args, real=real):
            descriptors.append(use_tma)
            return real(use_tma, *args)

        module._descriptors = spy
        # TMA where the module's default says, as on an sm90 GPU (the interpreter
        # emulates the copies; the automatic choice takes them only on a GPU).
        module._use_tma = lambda tma, default, *xs, real=module._use_tma: real(
            default if tma is None else tma, default, *xs
        )
        g = torch.Generator().manual_seed(3)
        try:
            if layout == "varlen":
                cu = [[0], [0]]
                for nq, nk in lengths:
                    cu[0].append(cu[0][-1] + nq)
                    cu[1].append(cu[1][-1] + nk)
                q = torch.randn(cu[0][-1], 2, 16, generator=g)
                k, v = (torch.randn(cu[1][-1], 1, 16, generator=g) for _ in "kv")
                k[cu[1][3] : cu[1][4]] *= 3e3  # a neighbour whose scores overflow
                kwargs = dict(
                    cu_seqlens_q=torch.tensor(cu[0], dtype=torch.int32),
                    cu_seqlens_k=torch.tensor(cu[1], dtype=torch.int32),
                )
            else:
                nq, nk = max(n for n, _ in lengths), max(n for _, n in lengths)
                q = torch.randn(len(lengths), 2, nq, 16, generator=g)
                k, v = (torch.randn(len(lengths), 1, nk, 16, generator=g) for _ in "kv")
                for b, (lq, lk) in enumerate(lengths):  # padding: inf and NaN
                    q[b, :, lq:], k[b, :, lk:], v[b, :, lk:] = (
                        float("inf"),
                        float("nan"),
                        float("nan"),
                    )
                kwargs = dict(
                    seqlens_q=torch.tensor([n for n, _ in lengths]),
                    seqlens_k=torch.tensor([n for _, n in lengths]),
                )
            q, k, v = (x.half().requires_grad_() for x in (q, k, v))
            do = torch.randn(q.shape, generator=g).half()
            leaves = [q, k, v]
            if learned:
                kwargs["rel"] = torch.randn(2, 8, generator=g).requires_grad_()
                leaves.append(kwargs["rel"])
            o = module.attention(q, k, v, **kwargs)
            runs.append((o, *torch.autograd.grad(o, leaves, do)))
        finally:
            del sys.modules[name]
    # The forward and the backward of each call: TMA in the backward with the knob only.
    assert descriptors == [False, False, False, True]
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.kernels
@pytest.mark.parametrize("mask", ["full", "causal"])
def test_the_gluon_probs_flag_leaves_the_triton_kernels_computing_the_variant(mask, tmp_path):
    """gluon_one_probs_call=flag gives `_scores_log2` and `_attn_probs` a
    run-time `edge` that the Triton kernels never pass (a full mask included,
    whose masked tiles test only the keys' end): forward and gradients still
    match the reference on the interpreter.  The Gluon kernels it changes
    run on the GPU only."""
    from flashgen.verify import check_backward

    variant = make_variant(mask, dtype=ir.DType.FP16, head_dim=64)
    source = render_module(variant, None, parse_settings(["gluon_one_probs_call=flag"]))
    assert "edge=True" in source and "True, whole == 0" in source
    import importlib.util
    import sys

    path = tmp_path / f"probs_flag_{mask}.py"
    path.write_text(source)  # the interpreter reads a kernel's source from its file
    spec = importlib.util.spec_from_file_location(f"flashgen_test_probs_flag_{mask}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, n, 64, generator=gen).half() for n in (21, 37, 37))
        results = [check_forward(variant, module, q, k, v)]
        results.append(check_backward(variant, module, q, k, v, generator=gen))
    finally:
        del sys.modules[spec.name]
    assert all(r.ok for r in results), results
