"""BENCHMARKS.md from benchmarks/results.jsonl and docs/decisions/.

    python3 scripts/benchmarks_md.py           # rewrite BENCHMARKS.md
    python3 scripts/benchmarks_md.py --check   # exit 1 if BENCHMARKS.md differs

The standing is the latest record (by order in the file: `flashgen bench
--jsonl` appends) of each spec, head dim, N, system and direction, timed by
do_bench and without error, for flashgen, FlexAttention and cuDNN, from runs
that timed flashgen beside another system (a run of flashgen alone, such as
scripts/gpu_before_after.sh's comparison of two commits, is data but no
standing against the others).  A record marked `superseded` (its kernels have
changed since; the field says how) stays as data and leaves the standing, and
so does a record of a drawn spec (`random`: `flashgen bench --random`), a
one-off that its seed names, not a spec of the standing.
Pure Python: no GPU, no torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from collections.abc import Iterable

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
RESULTS = os.path.join("benchmarks", "results.jsonl")
DECODE = os.path.join("benchmarks", "decode.jsonl")
DECODE_BENCH = os.path.join("benchmarks", "decode_bench.jsonl")
DECISIONS = os.path.join("docs", "decisions")
SYSTEMS = ("flashgen", "flex", "sdpa-cudnn")
# Rows in this order; specs not listed follow in alphabetical order.
SPEC_ORDER = (
    "full",
    "plain_causal",
    "mistral_sliding",
    "llama4_local",
    "prefix_lm",
    "bloom_alibi",
    "gemma2_local",
    "encoder_band",
    "custom",
)

METHOD = """\
Every number comes from `flashgen bench` (flashgen/bench.py): all systems in one process on one GPU
and the same inputs, B·N = 16384 tokens, each spec's dtype, median of `triton.testing.do_bench`,
FLOPs with the mask's real density (4·B·H·N²·D·density forward, 2.5× that backward), backward time
= (forward + backward) − forward, FlexAttention compiled afresh per case with a block mask, every
output compared with flashgen's first. A mask that reads runtime data has its block mask and,
from records with a `tile_plan` of "per batch" on (2026-12-03), flashgen's tile plan built once per
case outside the timed calls, each timed apart; older records built the tile plan in every call.
No timing is asserted in CI. All records, older runs
included, are in [benchmarks/results.jsonl](benchmarks/results.jsonl); `flashgen bench --jsonl
benchmarks/results.jsonl` appends a run's, and `python3 scripts/benchmarks_md.py` rewrites this
file from them (tests/test_scripts.py checks that it is current)."""


def load(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _run_point(r: dict) -> tuple:
    return (r["date"], r["run"], r["commit"], r["command"], r["spec"], r["D"], r["Nq"])


def standing(records: Iterable[dict]) -> dict[tuple, dict]:
    """(spec, D, N, system, direction) -> the latest do_bench record without
    error, of a run that timed more than flashgen at that point."""
    records = list(records)
    compared = {_run_point(r) for r in records if r.get("system") != "flashgen"}
    latest = {}
    for r in records:
        if r.get("timer") != "do_bench" or r.get("error") or r.get("system") not in SYSTEMS:
            continue
        if r.get("superseded") or r.get("random"):
            continue
        if r["Nq"] != r["Nk"] or _run_point(r) not in compared:
            continue
        latest[(r["spec"], r["D"], r["Nq"], r["system"], r["direction"])] = r
    return latest


def _spec_key(spec: str) -> tuple:
    return (SPEC_ORDER.index(spec), "") if spec in SPEC_ORDER else (len(SPEC_ORDER), spec)


def _tflops(latest: dict, spec: str, d: int, n: int, system: str) -> tuple:
    fwd = latest.get((spec, d, n, system, "fwd"))
    both = latest.get((spec, d, n, system, "fwd+bwd"))
    return (
        fwd["tflops"] if fwd else None,
        both["bwd_tflops"] if both else None,
        bool(both and both.get("host_paced")),
        [r["run"] or r["date"] for r in (fwd, both) if r],
    )


def _cell(fwd, bwd, paced) -> str:
    if fwd is None and bwd is None:
        return "–"
    f = "–" if fwd is None else f"{fwd:.0f}"
    b = "–" if bwd is None else f"{bwd:.0f}"
    return f"{f} / {b}{' h' if paced else ''}"


def _ratio(a, b, mark: bool = False) -> str:
    if a is None or b is None or b <= 0:
        return "–"
    x = a / b
    return f"{x:.2f}{' ✗' if mark and x < 1 else ''}"


def tables(latest: dict) -> tuple[list[str], list[tuple]]:
    """The markdown tables, one per head dim (largest first), and every
    compared point: (spec, D, N, direction, flashgen / Flex, flashgen / cuDNN)."""
    points = sorted({(s, d, n) for (s, d, n, sy, _) in latest if sy == "flashgen"})
    out, compared = [], []
    for d in sorted({d for _, d, _ in points}, reverse=True):
        out += [
            f"d{d} (TFLOP/s forward / backward; ratios flashgen / other; h: host-paced; "
            "✗: behind Flex):",
            "",
            "| spec | N | flashgen | Flex | cuDNN | vs Flex | vs cuDNN | runs |",
            "|---|---|---|---|---|---|---|---|",
        ]
        rows = sorted((p for p in points if p[1] == d), key=lambda p: (_spec_key(p[0]), p[2]))
        for spec, _, n in rows:
            ours, flex, cudnn = (_tflops(latest, spec, d, n, s) for s in SYSTEMS)
            runs = []
            for run in ours[3] + flex[3] + cudnn[3]:
                if run not in runs:
                    runs.append(run)
            vs_flex = " / ".join(_ratio(ours[i], flex[i], True) for i in (0, 1))
            vs_cudnn = " / ".join(_ratio(ours[i], cudnn[i]) for i in (0, 1))
            if cudnn[0] is None and cudnn[1] is None:
                vs_cudnn = "–"
            out.append(
                f"| {spec} | {n} | {_cell(*ours[:3])} | {_cell(*flex[:3])} | "
                f"{_cell(*cudnn[:3])} | {vs_flex} | {vs_cudnn} | {', '.join(runs)} |"
            )
            for i, direction in enumerate(("fwd", "bwd")):
                pair = [
                    ours[i] / other[i] if ours[i] and other[i] else None for other in (flex, cudnn)
                ]
                paced = direction == "bwd" and (ours[2] or flex[2])
                compared.append((spec, d, n, direction, *pair, paced))
        out.append("")
    return out, compared


def graph_ratios(records: Iterable[dict]) -> dict[tuple, tuple[float, str]]:
    """(spec, D, N, direction) -> (flashgen / Flex, date) from the latest run
    that timed both from CUDA graphs (`--timer cuda-graph`: the kernels alone,
    where a do_bench reading may be the host's pace)."""
    runs: dict[tuple, dict] = {}
    for r in records:
        if r.get("timer") != "cuda-graph" or r.get("error") or r.get("superseded"):
            continue
        if r.get("random") or r["Nq"] != r["Nk"] or r["system"] not in ("flashgen", "flex"):
            continue
        direction = "fwd" if r["direction"] == "fwd" else "bwd"
        value = r.get("tflops") if direction == "fwd" else r.get("bwd_tflops")
        if value:
            point = runs.setdefault((r["spec"], r["D"], r["Nq"], direction), {})
            point.setdefault(_run_point(r)[:4], {})[r["system"]] = value
    out = {}
    for key, by_run in runs.items():
        for run, values in by_run.items():  # in file order: the last pair wins
            if "flashgen" in values and "flex" in values:
                out[key] = (values["flashgen"] / values["flex"], run[0])
    return out


def summary(compared: list[tuple], graphs: dict | None = None) -> list[str]:
    graphs = graphs or {}
    lines = []
    for direction, name in (("fwd", "Forward"), ("bwd", "Backward")):
        vs_flex = [c for c in compared if c[3] == direction and c[4] is not None]
        if vs_flex:
            behind = [c for c in vs_flex if c[4] < 1]
            ratios = [c[4] for c in vs_flex]
            line = (
                f"- {name} vs FlexAttention: ahead at {len(vs_flex) - len(behind)} of "
                f"{len(vs_flex)} points ({min(ratios):.2f}–{max(ratios):.2f}×)"
            )
            if behind:
                line += "; behind at " + ", ".join(
                    f"{s} d{d} N={n} ({r:.2f}×{', host-paced' if paced else ''}"
                    + _graph_note(graphs.get((s, d, n, direction)))
                    + ")"
                    for s, d, n, _, r, _, paced in behind
                )
            lines.append(line + ".")
        vs_cudnn = [c for c in compared if c[3] == direction and c[5] is not None]
        if vs_cudnn:
            ratios = [c[5] for c in vs_cudnn]
            lines.append(
                f"- {name} vs cuDNN (full and causal): {min(ratios):.2f}–{max(ratios):.2f}× "
                f"over {len(ratios)} points."
            )
    return lines


def _graph_note(graph: tuple[float, str] | None) -> str:
    return "" if graph is None else f"; {graph[0]:.2f}× from CUDA graphs, {graph[1]}"


def commands(latest: dict) -> list[str]:
    """One line per run that the standing shows: where, at what commit, and
    the command (each spec's `examples/<spec>.attn` written once as <spec>)."""
    runs: dict[tuple, dict] = {}
    for r in latest.values():
        key = (r["date"], r["run"] or "", r["commit"] or "")
        entry = runs.setdefault(key, {"records": [], "commands": []})
        entry["records"].append(r)
        cmd = r["command"]
        if cmd:
            cmd = re.sub(r"examples/\w+\.attn", "examples/<spec>.attn", cmd)
            cmd = re.sub(r"--head-dim \d+", "--head-dim <d>", cmd)
            if cmd not in entry["commands"]:
                entry["commands"].append(cmd)
    out = []
    for (date, run, commit), entry in sorted(runs.items()):
        first = entry["records"][0]
        specs = sorted({r["spec"] for r in entry["records"]}, key=_spec_key)
        head = f"- {'run ' + run + ', ' if run else ''}{date}, commit {commit or 'not recorded'}"
        head += f", {first['gpu']}, torch {first['torch']}, triton {first['triton']}"
        head += f" ({', '.join(specs)}):"
        out.append(head)
        out += [f"  `{c}`" for c in entry["commands"]]
    return out


def decode_table(records: Iterable[dict]) -> list[str]:
    """The latest record of each decode point (spec, B, Nk, Nq): TB/s of K and V."""
    latest = {}
    for r in records:
        latest[(r["spec"], r["batch"], r["n_keys"], r["n_queries"])] = r
    systems = ("flashgen_decode", "flashgen_ordinary", "sdpa_cudnn", "sdpa_flash")
    lines = [
        "| spec | B · Nk | Nq | flashgen | (prefill kernel) | cuDNN | flash | vs cuDNN | commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (spec, b, nk, nq), r in latest.items():
        tb = [r.get(s, {}).get("tb_per_s") for s in systems]
        cells = [f"{x:.2f}" if x else "—" for x in tb]
        ratio = f"{tb[0] / tb[2]:.2f}×" if tb[0] and tb[2] else "—"
        ok = "" if all(c["ok"] for c in r["checks"]) else " (check failed)"
        lines.append(
            f"| {spec}{ok} | {b} · {nk // 1024}k | {nq} | " + " | ".join(cells) + f" | {ratio} |"
            f" {r['commit']} |"
        )
    return lines


def decode_bench_table(records: Iterable[dict]) -> list[str]:
    """The latest `flashgen bench --decode` record of each point (spec, B,
    Nk, Nq) and system: TB/s of K and V, flashgen's over cuDNN's, and its
    paged cache's over its contiguous one."""
    points: dict[tuple, dict] = {}
    for r in records:
        if r.get("error") or not r.get("tb_per_s"):
            continue
        key = (r["variant"], r["batch"], r["n_keys"], r["n_queries"])
        system = r["system"] if r["layout"] == "contiguous" else r["layout"]
        points.setdefault(key, {})[system] = r
    pages = sorted({s for p in points.values() for s in p if s.startswith("paged")})
    systems = ("flashgen", *pages, "flex", "sdpa-cudnn", "sdpa-flash")
    lines = [
        "| spec | B · Nk | Nq | " + " | ".join(systems) + " | vs cuDNN | paged / contiguous |"
        " commit |",
        "|---|---|---|" + "---|" * (len(systems) + 3),
    ]
    for (spec, b, nk, nq), found in points.items():
        tb = {s: found[s]["tb_per_s"] for s in systems if s in found}
        cells = [f"{tb[s]:.2f}" if s in tb else "—" for s in systems]
        ours = tb.get("flashgen")
        ratio = f"{ours / tb['sdpa-cudnn']:.2f}×" if ours and "sdpa-cudnn" in tb else "—"
        paged = " ".join(f"{tb[s] / ours:.2f}" for s in pages if ours and s in tb) or "—"
        commit = (found.get("flashgen") or next(iter(found.values())))["commit"]
        lines.append(
            f"| {spec} | {b} · {nk // 1024}k | {nq} | " + " | ".join(cells)
            + f" | {ratio} | {paged} | {commit} |"
        )  # fmt: skip
    return lines if len(lines) > 2 else []


def random_table(records: Iterable[dict]) -> list[str]:
    """flashgen / FlexAttention over the drawn specs of each `bench --random`
    run (records with `random`), by seed, head dim and N: the points timed
    beside Flex, the median and minimum of each pass, and the points below 1."""
    groups: dict[tuple, dict] = {}
    for r in records:
        if not r.get("random") or r.get("error") or r["system"] not in ("flashgen", "flex"):
            continue
        key = (r["run"], r["random"]["seed"], r["D"], r["Nq"])
        point = groups.setdefault(key, {"commit": r["commit"]}).setdefault(r["spec"], {})
        point[(r["system"], r["direction"])] = r.get("ms" if r["direction"] == "fwd" else "bwd_ms")
    lines = [
        "| run | seed | d | N | specs | forward median / min / below 1 |"
        " backward median / min / below 1 | commit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (run, seed, d, n), group in groups.items():
        commit = group.pop("commit")
        cells = []
        for direction in ("fwd", "fwd+bwd"):
            ratios = sorted(
                p[("flex", direction)] / p[("flashgen", direction)]
                for p in group.values()
                if p.get(("flex", direction)) and p.get(("flashgen", direction))
            )
            if not ratios:
                cells.append("—")
                continue
            below = sum(x < 1 for x in ratios)
            median = statistics.median(ratios)
            cells.append(f"{median:.2f}× / {ratios[0]:.2f}× / {below} of {len(ratios)}")
        if cells == ["—", "—"]:  # flashgen alone (a plan knob's run): no comparison
            continue
        lines.append(
            f"| {run} | {seed} | {d} | {n} | {len(group)} | {' | '.join(cells)} | {commit} |"
        )
    return lines if len(lines) > 2 else []


def decision_index(root: str) -> list[str]:
    out = []
    folder = os.path.join(root, DECISIONS)
    for name in sorted(os.listdir(folder)):
        if not re.match(r"\d{3}-.*\.md$", name):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            title = f.readline().lstrip("# ").strip()
        out.append(f"- [{title}]({DECISIONS}/{name})")
    return out


def render(root: str = ROOT) -> str:
    latest = standing(load(os.path.join(root, RESULTS)))
    table_lines, compared = tables(latest)
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated by scripts/benchmarks_md.py from benchmarks/results.jsonl; do not edit. -->",
        "",
        METHOD,
        "",
        "## Current standing",
        "",
        "The latest do_bench result of each spec, head dim, N and system. h marks a forward +",
        "backward that ran at the host's pace (the bench's own flag): its number is the host's, and",
        "do_bench readings there swing from run to run (decision 019; `--timer cuda-graph` records",
        "in the results file time the kernels alone; a point behind Flex below names the latest",
        "such ratio of both systems where one exists).",
        "",
        *summary(compared, graph_ratios(load(os.path.join(root, RESULTS)))),
        "",
        *table_lines,
        "Made by these runs (one process per spec and head dim unless the command names several):",
        "",
        *commands(latest),
        "",
        "## Decoding",
        "",
        "Split-KV decoding (decision 052): bf16, d128, H = 32, Hkv = 8, TB/s = bytes of K and V /",
        "median do_bench time, from `python3 scripts/gpu_decode.py` (records in",
        "[benchmarks/decode.jsonl](benchmarks/decode.jsonl)). A sliding window reads only its window,",
        "so its TB/s counts bytes it does not read. Nq = 4 causal has no SDPA equivalent (SDPA's",
        "causal is top-left).",
        "",
        *decode_table(load(decode) if os.path.exists(decode := os.path.join(root, DECODE)) else []),
        "",
        "`flashgen bench --decode` (records in",
        "[benchmarks/decode_bench.jsonl](benchmarks/decode_bench.jsonl)): the same shapes, every",
        "system in one process on the same cache, FlexAttention compiled for each shape; the paged",
        "column times flashgen on that cache as shuffled pages through a block table, without the",
        "host's check of lengths and pages (as a serving step or a CUDA graph calls it). B · Nk",
        "below 256k tokens runs at the host's pace: there the numbers are the host's.",
        "",
        *decode_bench_table(
            load(bench) if os.path.exists(bench := os.path.join(root, DECODE_BENCH)) else []
        ),
        "",
        "## Drawn specs",
        "",
        "`flashgen bench --random N --seed S` (issue 23's target: every point at least 1.0× Flex,",
        "forward and backward, the median at least 1.3×), flashgen's speed over FlexAttention's per",
        "drawn spec, bf16, B·N = 16384, H = 16; the specs' text is in each record:",
        "",
        *random_table(load(os.path.join(root, RESULTS))),
        "",
        "## Decisions",
        "",
        "The optimization log, one file per decision (docs/decisions/README.md: conventions and",
        "the ablations):",
        "",
        *decision_index(root),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if BENCHMARKS.md differs")
    args = parser.parse_args(argv)
    text = render()
    path = os.path.join(ROOT, "BENCHMARKS.md")
    if args.check:
        with open(path, encoding="utf-8") as f:
            if f.read() != text:
                print(
                    "BENCHMARKS.md differs from scripts/benchmarks_md.py's output", file=sys.stderr
                )
                return 1
        return 0
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
