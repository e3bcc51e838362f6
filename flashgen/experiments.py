"""Experiment knobs: settings of a module's plan that change how its kernels
run, never what they compute, for measuring one choice against another on
a GPU (`flashgen build --plan NAME=VALUE`, `flashgen bench --plan ...`).

They replace text patches of generated modules: an experiment is a field of
the `KernelModel` (or of its tile sections) that the lowering would otherwise
decide.  Only settings that keep the result are allowed: a Gluon kernel can be
turned off but not on (the lowering turns it on only where it is correct), the
accurate tanh on but not off.  A module built with knobs says so in its
docstring.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from flashgen.launch import LaunchConfig
from flashgen.lower import KernelModel


class ExperimentError(ValueError):
    """A --plan setting that is not a knob, or a value the knob does not take."""


def _bool(text: str) -> bool:
    values = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
    if text.lower() not in values:
        raise ValueError("expected on or off")
    return values[text.lower()]


def _only(value: object) -> Callable[[str], object]:
    """A knob that may only be set one way: to `value`, given as on (True)
    or off (None, False)."""
    setting = "on" if value is True else "off"

    def parse(text: str) -> object:
        if _bool(text) != (value is True):
            raise ValueError(f"can only be set {setting}")
        return value

    return parse


def _ints(count: int, low: int, high: int) -> Callable[[str], tuple[int, ...]]:
    def parse(text: str) -> tuple[int, ...]:
        parts = text.split(",")
        if len(parts) != count or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"expected {count} integer{'s' * (count > 1)} separated by commas")
        values = tuple(int(p) for p in parts)
        if not all(low <= v <= high for v in values):
            raise ValueError(f"each must lie in [{low}, {high}]")
        return values

    return parse


def _one_of(*values: str) -> Callable[[str], str | None]:
    """A knob of named values, the first of which (off) is None."""

    def parse(text: str) -> str | None:
        if text.lower() not in values:
            raise ValueError(f"expected one of {', '.join(values)}")
        return None if text.lower() == values[0] else text.lower()

    return parse


def _streams(text: str) -> tuple[int, ...]:
    values = _ints(2, 64, 128)(text)
    if not all(v in (64, 128) for v in values):
        raise ValueError("each must be 64 or 128")
    return values


def _config(text: str) -> LaunchConfig:
    block_m, block_n, warps, stages = _ints(4, 1, 256)(text)
    for name, value, low in (
        ("block_m", block_m, 16),
        ("block_n", block_n, 16),
        ("warps", warps, 1),
    ):
        if value < low or value & (value - 1):
            raise ValueError(f"{name} must be a power of two >= {low}, got {value}")
    if not 1 <= stages <= 8:
        raise ValueError(f"stages must lie in [1, 8], got {stages}")
    return LaunchConfig(block_m, block_n, warps, stages)


# Knob -> parser of its value.  Each is a KernelModel field, or a TileSection
# field (`_SECTION_KNOBS`) set on the model's tile sections.
KNOBS: dict[str, Callable[[str], object]] = {
    "gpu_config": _config,  # BLOCK_M,BLOCK_N,WARPS,STAGES of the Triton forward
    "gpu_bwd_config": _config,  # the same for the Triton backward
    "gpu_tma": _bool,  # forward: key tiles through TMA descriptors by default
    "gpu_bwd_tma": _bool,  # backward: the same
    "gluon_forward": _only(None),  # off: the Triton forward everywhere
    "gluon_backward": _only(False),  # off: the Triton backward everywhere
    "gluon_stages": lambda text: _ints(1, 1, 4)(text)[0],  # K/V buffers of the Gluon forward
    "gluon_bwd_stages": _ints(2, 1, 4),  # streamed buffers: dK/dV kernel, dQ kernel
    "gluon_bwd_streams": _streams,  # streamed rows: dK/dV kernel's Q and dO, dQ kernel's K and V
    "gluon_min_keys": lambda text: _ints(1, 0, 1 << 24)(text)[0],
    "gluon_dq_heavy_last": _bool,  # the Gluon dQ CTAs take the last rows first
    "tanh_small_poly": _only(True),  # on: tanh accurate near 0 (never off)
    "fast_math": _only(False),  # off: tanh and log by their accurate paths on the GPU too
    "gather_unpipelined": _bool,  # on: input reads kept out of the software pipeline
    "hoist_reads": _bool,  # off: no score read loaded once for a tile it is constant over
    "merged_edges": _bool,  # one loop per program, edge tiles masked in a branch (or three loops)
    "heads_first": _bool,  # the Triton forward's grid (batch * heads, query tiles), or not
    "bwd_heads_first": _bool,  # the Triton backward's grid (batch * heads, tiles), or not
    "branchless_tiles": _bool,  # loops without an interior: every tile masked, no branch
    "classify_edge_tiles": _only(False),  # off: the masked loops run without the tile test
    "seqs_tma": _only(True),  # on: padded and varlen calls' backward loads through TMA too
    "gluon_one_probs_call": _one_of("off", "flag", "masked"),  # the Gluon backward's P: one call
    # on: residue classes wherever the mask allows them, off: positions (decision 085)
    "residue_classes": _bool,
    # on: the score's distances from positions converted per row and column (decision 094)
    "float_distances": _bool,
    # on: the Gluon backward for masks over runtime data at head dim 128 too (decision 095)
    "gluon_data_d128": _bool,
    # on: the any-mask Gluon forward for masks over runtime data (decision 098)
    "gluon_data_forward": _bool,
    # on: varlen calls of sequences with as many queries as keys take the Gluon forward (102)
    "gluon_varlen": _bool,
    # on: such calls take the Gluon backward too (decision 104)
    "gluon_varlen_backward": _bool,
    # on: such calls captured in a CUDA graph take them over a table made on the GPU (107)
    "gluon_varlen_captured": _bool,
    # off: a mask over packed documents keeps its own kernels for calls whose ids form
    # runs, not the Gluon kernels of its positional part (decision 109)
    "document_runs": _bool,
}
# Knobs the lowering takes (`lower(variant, residue_classes=...)`), as they
# change the tile analysis or the element code itself, rather than fields set
# on its model.
LOWERING_KNOBS = frozenset(
    {"residue_classes", "float_distances", "gluon_data_d128", "gluon_data_forward", "document_runs"}
)
_SECTION_KNOBS = frozenset({"merged_edges", "branchless_tiles", "classify_edge_tiles"})


def parse_settings(settings: list[str]) -> dict[str, object]:
    """NAME=VALUE strings -> knob values; ExperimentError naming every problem."""
    values: dict[str, object] = {}
    problems = []
    for setting in settings:
        name, sep, text = setting.partition("=")
        name = name.strip()
        if not sep:
            problems.append(f"{setting!r}: expected NAME=VALUE")
        elif name not in KNOBS:
            problems.append(f"{name!r} is not a plan knob; the knobs are {', '.join(KNOBS)}")
        elif name in values:
            problems.append(f"{name!r} is set twice")
        else:
            try:
                values[name] = KNOBS[name](text.strip())
            except ValueError as e:
                problems.append(f"{name}={text.strip()}: {e}")
    if problems:
        raise ExperimentError("; ".join(problems))
    return values


def apply(model: KernelModel, values: Mapping[str, object]) -> KernelModel:
    """`model` with the knobs set, and their settings recorded in it."""
    if not values:
        return model
    if model.residue_step > 1:  # the class kernels take pointer loads and the plain grids
        clash = [
            name for name in ("heads_first", "bwd_heads_first", "seqs_tma") if values.get(name)
        ]
        if clash:
            raise ExperimentError(
                f"{', '.join(clash)}: not for kernels that walk residue classes (decision 085); "
                "set residue_classes=off with it"
            )
    gluon_forward = values.get("gluon_forward", model.gluon_forward)
    gluon_backward = values.get("gluon_backward", model.gluon_backward)
    if values.get("gluon_varlen") and (not gluon_forward or model.inputs):
        raise ExperimentError(
            "gluon_varlen: for a module with the Gluon forward and no declared inputs"
        )
    if values.get("gluon_varlen_backward") and (not gluon_backward or model.inputs):
        raise ExperimentError(
            "gluon_varlen_backward: for a module with the Gluon backward and no declared inputs"
        )
    # Varlen calls take a pass's Gluon kernel where the knob says so, or by
    # default where the module keeps it (without it: the Triton one).
    varlen = {
        "gluon_varlen": values.get("gluon_varlen", model.gluon_varlen and bool(gluon_forward)),
        "gluon_varlen_backward": values.get(
            "gluon_varlen_backward", model.gluon_varlen_backward and bool(gluon_backward)
        ),
    }
    if values.get("gluon_varlen_captured") and not any(varlen.values()):
        raise ExperimentError(
            "gluon_varlen_captured: for a module whose varlen calls take the Gluon kernels"
        )
    varlen["gluon_varlen_captured"] = values.get(
        "gluon_varlen_captured", model.gluon_varlen_captured and any(varlen.values())
    )
    streams = values.get("gluon_bwd_streams", (64, 64))
    stages = values.get("gluon_bwd_stages", model.gluon_bwd_stages)
    if streams != (64, 64):
        # The call's plan covers 64-row tiles (decision 078); 128-row tiles of a
        # 128-wide head overflow shared memory beside K and V (dK/dV) or with
        # more than two buffers (dQ).
        if model.data_plan is not None:
            raise ExperimentError("gluon_bwd_streams: a mask over runtime data takes 64,64")
        if model.head_dim_pad > 64 and (streams[0] > 64 or stages[1] > 2):
            raise ExperimentError(
                "gluon_bwd_streams: at head dim 128 the dK/dV kernel streams 64 rows, and the "
                "dQ kernel's 128-key tiles fit two buffers"
            )
        if streams[0] > 64 and not model.tiles.mask_is_full:
            raise ExperimentError(
                "gluon_bwd_streams: the dK/dV kernel streams 64 rows for a mask that cuts tiles "
                "(with 128, masked tiles in 64-row parts gave wrong dK and dV for window(100, 60) "
                "on an H100, decision 095)"
            )
    record = tuple(f"{name}={_show(value)}" for name, value in values.items())
    fields = {
        name: value
        for name, value in values.items()
        if name not in LOWERING_KNOBS and name not in _SECTION_KNOBS
    }
    fields.update(varlen)
    # The loop knobs set the whole mask's loops (`model.tiles`) and each
    # residue section's (decision 085).
    looped = {name: value for name, value in values.items() if name in _SECTION_KNOBS}
    tiles = dataclasses.replace(model.tiles, **looped)
    sections = tuple(dataclasses.replace(s, **looped) for s in model.residue_sections)
    return dataclasses.replace(
        model,
        **fields,
        tiles=tiles,
        residue_sections=sections,
        experiments=model.experiments + record,
    )


def _show(value: object) -> str:
    if isinstance(value, LaunchConfig):
        return f"{value.block_m},{value.block_n},{value.num_warps},{value.num_stages}"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, bool) or value is None:
        return "on" if value else "off"
    return str(value)
