"""Semantic checks: parsed `ir.SpecFile`s in, checked `ir.Variant`s and Diagnostics out.

`check(files)` checks every block of every file and lists every problem it
finds (it does not stop at the first).  It returns the Variants of the blocks
that checked clean, in file and block order, together with all diagnostics;
a block with any error yields no Variant.  Callers that must be all-or-nothing
(the CLI writes no file) treat a non-empty diagnostics list as failure.

What a Variant holds (see `ir.Variant`):

* `mask` and `score` are the expressions as parsed, spans kept, except that
  these constants are folded to `ir.Num` literals carrying the span of the
  expression they replace: the arguments of `window`, `prefix` and `chunk`
  (ints), the right operand of `div` and `%` (a positive int), and the cap of
  `softcap` (a positive float, even when written as an integer).
* `head_dim` is an int, and so is `v_head_dim` when set (v's, o's and dO's
  last dimension, DeepSeek's MLA; `Variant.v_dim` is head_dim otherwise); `scale` (when set) and `rescale_threshold` are floats.
* Defaults: mask `ir.FULL`, score `ir.IDENTITY_SCORE`, align bottom_right,
  rescale_threshold 0.0, scale None.

Beyond kinds, a mask or score is accepted only when kernels can compute it
exactly as the reference does (docs/LANGUAGE.md, "Limits"):
`integer_magnitude` bounds every integer subexpression, comparison
difference and named-mask definition within ±ir.INT_MAGNITUDE_MAX (int32
with room for tile bounds); every real constant, `scale`, softcap cap and
`rescale_threshold` must be 0 or a normal float32; expressions deeper or
larger than ir.MAX_EXPR_DEPTH / ir.MAX_EXPR_NODES are refused before
anything recurses into them; block names that would shadow a module or name
generated code relies on (`reserved_block_name`) are refused.

`div` is floor division and `%` its remainder, so with the positive divisor
that is required here `%` always lies in [0, divisor).
"""

from __future__ import annotations

import builtins
import difflib
import functools
import keyword
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from flashgen import index_ranges, input_grads, ir
from flashgen.diagnostics import Diagnostic, expression_too_deep, expression_too_large
from flashgen.mask_forms import desugar_mask, hides_every_pair, negation_normal_form
from flashgen.printer import print_expr, print_input

__all__ = ["check", "integer_magnitude", "reserved_block_name"]

Kind = ir.Kind

_INT32_LIMIT = 2**31
# Block names become Python module and file names.  (The language's own
# keywords, `attention` and `div`, never get here: the parser refuses them.)
_BLOCK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_BLOCK_NAME_MAX = 64
# A block becomes `<name>.py` (`flashgen build`) or a module of the package
# `flashgen_generated` (`flashgen.load`).  Names that such a file would shadow
# for code beside it, or that read as something else, are refused, ignoring
# case as case-insensitive file systems do.  Each maps to why.
_RESERVED_BLOCK_NAMES: dict[str, str] = {}
for _name in sorted(dir(builtins)):
    _RESERVED_BLOCK_NAMES.setdefault(_name.casefold(), f"`{_name}` is a Python builtin")
for _name in sorted(sys.stdlib_module_names):
    _RESERVED_BLOCK_NAMES[_name.casefold()] = f"`{_name}` is a module of Python's standard library"
# Top-level modules a generated module imports (the standard-library
# ones are covered above, but say so explicitly).
for _name in ("functools", "math", "os", "typing", "torch", "triton"):
    _RESERVED_BLOCK_NAMES[_name] = f"`{_name}` is a module that generated modules import"
_RESERVED_BLOCK_NAMES["flashgen"] = "`flashgen` is flashgen's own package"
_RESERVED_BLOCK_NAMES["flashgen_generated"] = (
    "`flashgen_generated` is the package that `flashgen.load` puts modules in"
)
# The public names every generated module defines.
for _name in ("SPEC", "HEAD_DIM", "V_DIM", "DTYPE", "DEFAULT_SCALE", "RESCALE_THRESHOLD"):
    _RESERVED_BLOCK_NAMES[_name.casefold()] = f"`{_name}` is a name every generated module defines"
del _name

_DTYPE_ALIASES = {
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
}
_DTYPES = tuple(d.value for d in ir.DType)
_ALIGNS = tuple(a.value for a in ir.Align)

_MASK_NAMES = tuple(sorted(ir.INT_VARIABLES | ir.NAMED_MASKS))
_SCORE_NAMES = tuple(sorted(ir.INT_VARIABLES | {ir.SCORE_VARIABLE, ir.ALIBI}))
_MASK_FUNCTIONS = tuple(sorted({*ir.MASK_FUNCTIONS, *ir.POLY_FUNCTIONS}))
_SCORE_FUNCTIONS = tuple(sorted({*ir.REAL_FUNCTIONS, *ir.POLY_FUNCTIONS, ir.SOFTCAP}))
_ALL_FUNCTIONS = frozenset(_MASK_FUNCTIONS + _SCORE_FUNCTIONS)

_MASK_KINDS = "the mask must be an integer/boolean expression"

_SETTING_RULES = {
    "head_dim": f"a multiple of {ir.HEAD_DIM_MULTIPLE} "
    f"between {ir.HEAD_DIM_MIN} and {ir.HEAD_DIM_MAX}",
    "v_head_dim": f"a multiple of {ir.HEAD_DIM_MULTIPLE} "
    f"between {ir.HEAD_DIM_MIN} and {ir.HEAD_DIM_MAX}",
    "dtype": "one of " + ", ".join(_DTYPES),
}


def check(
    files: Sequence[ir.SpecFile], *, learnable: bool = False
) -> tuple[tuple[ir.Variant, ...], list[Diagnostic]]:
    """Check all blocks of all files; see the module docstring for the contract.

    `learnable`: accept every read of a learnable input, also those whose
    gradient no kernel sums (`flashgen.input_grads`), for the reference and
    its tests; off, the reads no kernel sums are refused once everything else
    has been checked."""
    variants: list[ir.Variant] = []
    diagnostics: list[Diagnostic] = []
    first_by_name: dict[str, tuple[str, ir.Block]] = {}
    first_by_folded_name: dict[str, tuple[str, ir.Block]] = {}
    for spec in files:
        file_diagnostics: list[Diagnostic] = []
        for block in spec.blocks:
            report = _Reporter(spec.path)
            variant = _check_block(block, report, learnable)
            _check_unique_name(block, spec.path, first_by_name, first_by_folded_name, report)
            file_diagnostics += report.diagnostics
            if variant is not None and not report.diagnostics:
                variants.append(variant)
                file_diagnostics += _warnings(variant, block, spec.path)
        diagnostics += sorted(file_diagnostics, key=_position)
    return tuple(variants), diagnostics


def _warnings(variant: ir.Variant, block: ir.Block, path: str) -> list[Diagnostic]:
    """What an accepted block may not mean: a mask that hides every (query,
    key) pair whatever the sizes, heads and data (`mask_forms.hides_every_pair`
    of the mask as the kernels take it; e.g. `causal & !causal`, `k < 5 & k >
    9`).  Its outputs are all 0 (a row that sees no key is defined so), so
    the block is kept, with a warning at its mask."""
    if not hides_every_pair(negation_normal_form(desugar_mask(variant.mask))):
        return []
    (setting,) = [s for s in block.settings if s.key == "mask"]
    return [
        Diagnostic(
            path,
            setting.value.span,
            "this mask hides every (query, key) pair: every output row is 0, its "
            "log-sum-exp -inf, and every gradient 0",
            severity="warning",
            note="a row that sees no key is defined so (docs/LANGUAGE.md); if the mask is "
            "meant to show some pairs, one of its terms contradicts another",
        )
    ]


def _position(d: Diagnostic) -> tuple[int, int]:
    return d.span.line, d.span.column


class _Reporter:
    def __init__(self, path: str) -> None:
        self.path = path
        self.diagnostics: list[Diagnostic] = []

    def __call__(self, span: ir.Span, message: str, note: str | None = None) -> None:
        self.diagnostics.append(Diagnostic(self.path, span, message, note=note))


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def _kind_words(kind: Kind) -> str:
    return {Kind.INT: "an integer", Kind.REAL: "a real", Kind.BOOL: "a boolean"}[kind]


# --------------------------------------------------------------------------- #
# Blocks and settings
# --------------------------------------------------------------------------- #


def _check_unique_name(
    block: ir.Block,
    path: str,
    first_by_name: dict[str, tuple[str, ir.Block]],
    first_by_folded_name: dict[str, tuple[str, ir.Block]],
    report: _Reporter,
) -> None:
    first = first_by_name.get(block.name)
    if first is not None:
        first_path, first_block = first
        where = f"{first_path}:{first_block.name_span.line}:{first_block.name_span.column}"
        report(
            block.name_span,
            f"duplicate block name '{block.name}'",
            note=f"first defined at {where}",
        )
        return
    first_by_name[block.name] = (path, block)
    folded = block.name.casefold()
    first = first_by_folded_name.get(folded)
    if first is not None:
        first_path, first_block = first
        where = f"{first_path}:{first_block.name_span.line}:{first_block.name_span.column}"
        report(
            block.name_span,
            f"block name '{block.name}' differs from '{first_block.name}' only in case",
            note=f"'{first_block.name}' is defined at {where}; their generated "
            "files would collide on case-insensitive file systems",
        )
        return
    first_by_folded_name[folded] = (path, block)


def _check_block(block: ir.Block, report: _Reporter, learnable: bool) -> ir.Variant | None:
    _check_block_name(block, report)
    inputs, broken = _check_inputs(block.inputs, report)
    used: set[str] = set(broken)
    values: dict[str, object] = {}
    first_key_span: dict[str, ir.Span] = {}
    for setting in block.settings:
        checker = _SETTING_CHECKERS.get(setting.key)
        if checker is None:
            hint = _did_you_mean(setting.key, ir.SETTINGS)
            report(
                setting.key_span,
                f"unknown setting '{setting.key}'{hint}",
                note=None if hint else "settings are " + ", ".join(ir.SETTINGS),
            )
            continue
        size_problem = _size_problem(setting.value)
        if size_problem is not None:
            # `parse` never gives such a tree; one built by hand is refused here
            # before anything recurses into it.
            report(*size_problem)
            value = None
        elif setting.key in ("mask", "score"):
            value = checker(setting.value, report, inputs=inputs, used=used)
        else:
            value = checker(setting.value, report)
        if setting.key in first_key_span:
            first = first_key_span[setting.key]
            report(
                setting.key_span,
                f"duplicate setting `{setting.key}`",
                note=f"first set at line {first.line}, column {first.column}",
            )
            continue
        first_key_span[setting.key] = setting.key_span
        values[setting.key] = value
    for key in ir.REQUIRED_SETTINGS:
        if key not in values:
            report(
                block.name_span,
                f"block '{block.name}' is missing the required setting `{key}`",
                note=f"`{key}` must be {_SETTING_RULES[key]}",
            )
    if report.diagnostics or any(v is None for v in values.values()):
        return None
    for decl in block.inputs:
        if decl.name not in used:
            report(
                decl.name_span,
                f"input `{decl.name}` is declared but neither the mask nor the score reads it",
                note="remove the declaration, or index the input where it is meant",
            )
    if report.diagnostics:
        return None
    variant = ir.Variant(
        name=block.name,
        head_dim=values["head_dim"],
        dtype=values["dtype"],
        mask=values.get("mask", ir.FULL),
        score=values.get("score", ir.IDENTITY_SCORE),
        scale=values.get("scale"),
        align=values.get("align", ir.Align.BOTTOM_RIGHT),
        rescale_threshold=values.get("rescale_threshold", 0.0),
        inputs=tuple(inputs.values()),
        v_head_dim=values.get("v_head_dim"),
        span=block.span,
        path=report.path,
    )
    if not learnable:
        for problem in input_grads.analyse(variant)[1]:
            report(problem.span, problem.message, note=problem.note)
    return None if report.diagnostics else variant


# --------------------------------------------------------------------------- #
# Input declarations
# --------------------------------------------------------------------------- #

# Keyword arguments of a generated module's attention(), forward() and
# backward(): an input becomes one more.
_API_ARGUMENTS = frozenset(
    {"q", "k", "v", "o", "lse", "do", "dlse", "scale", "return_lse"}
    | {"block_m", "block_n", "num_warps", "num_stages", "tma"}
)
# Names a generated module uses where an input's name also appears: modules it
# imports (an argument would shadow them in the API's bodies), and the stems of
# the kernels' own pointer parameters (`delta_ptr` beside `delta_ptr`).
_MODULE_NAMES = frozenset(
    {"torch", "triton", "tl", "math", "os", "functools", "typing", "gl", "gluon", "mbarrier"}
    | {"alibi_slopes", "delta", "dq", "dk", "dv", "inputs", "args"}
)
_LANGUAGE_NAMES = (
    ir.INT_VARIABLES
    | ir.NAMED_MASKS
    | {ir.SCORE_VARIABLE, ir.ALIBI, ir.SOFTCAP}
    | set(ir.MASK_FUNCTIONS)
    | ir.REAL_FUNCTIONS
    | set(ir.POLY_FUNCTIONS)
)
_ELEMENTS = tuple(e.value for e in ir.Element)
_ELEMENT_ALIASES = {
    "int": "int32",
    "i32": "int32",
    "i64": "int64",
    "long": "int64",
    **_DTYPE_ALIASES,
}


def _check_inputs(
    decls: Sequence[ir.InputDecl], report: _Reporter
) -> tuple[dict[str, ir.Input], set[str]]:
    """The well-formed declarations by name, and the names of the others
    (whose uses are then not reported again); every problem is reported."""
    inputs: dict[str, ir.Input] = {}
    first: dict[str, ir.InputDecl] = {}
    for decl in decls:
        ok = _input_name_ok(decl, report)
        if decl.name in first:
            earlier = first[decl.name].name_span
            report(
                decl.name_span,
                f"duplicate input `{decl.name}`",
                note=f"first declared at line {earlier.line}, column {earlier.column}",
            )
            continue
        first[decl.name] = decl
        element = _input_element(decl, report)
        shape_ok = _input_shape_ok(decl, report)
        if element is not None and decl.learnable and element.is_integer:
            report(
                decl.element_span,
                f"an integer input cannot be learnable; `{decl.name}` holds {element.value}",
                note="learnable inputs are reals (fp32, fp16, bf16) that get a gradient",
            )
            ok = False
        if ok and shape_ok and element is not None:
            inputs[decl.name] = ir.Input(
                decl.name, element, decl.shape, decl.learnable, span=decl.span
            )
    return inputs, set(first) - set(inputs)


def _input_name_ok(decl: ir.InputDecl, report: _Reporter) -> bool:
    name = decl.name
    why = None
    if name in _LANGUAGE_NAMES:
        why = f"`{name}` is a name of the language"
    elif name in ir.SIZES:
        why = f"`{name}` names a size"
    elif name in _API_ARGUMENTS:
        why = f"`{name}` is an argument of the module's attention()"
    elif keyword.iskeyword(name) or name.startswith("_"):
        why = f"`{name}` cannot be a Python keyword argument"
    elif name in _MODULE_NAMES:
        why = f"`{name}` is a name the generated module uses"
    elif name in dir(builtins):
        why = f"`{name}` is a Python builtin, which the module's functions may call"
    if why is not None:
        report(decl.name_span, f"input name `{name}` is not allowed: {why}")
    return why is None


def _input_element(decl: ir.InputDecl, report: _Reporter) -> ir.Element | None:
    if decl.element in _ELEMENTS:
        return ir.Element(decl.element)
    alias = _ELEMENT_ALIASES.get(decl.element)
    hint = f"; did you mean '{alias}'?" if alias else _did_you_mean(decl.element, _ELEMENTS)
    report(
        decl.element_span,
        f"unknown element type '{decl.element}'{hint}",
        note="inputs hold one of " + ", ".join(_ELEMENTS),
    )
    return None


def _input_shape_ok(decl: ir.InputDecl, report: _Reporter) -> bool:
    ok = True
    if not decl.shape:
        report(
            decl.span,
            f"`{decl.name}` has no dimensions; an input has 1 to {ir.MAX_INPUT_RANK}",
            note=f"declare one number as `{decl.name}: {decl.element}[1]` and read `{decl.name}[0]`",
        )
        ok = False
    if len(decl.shape) > ir.MAX_INPUT_RANK:
        report(
            decl.span,
            f"`{decl.name}` has {len(decl.shape)} dimensions; inputs have at most "
            f"{ir.MAX_INPUT_RANK}",
        )
        ok = False
    for size, span in zip(decl.shape, decl.size_spans):
        if isinstance(size, str) and size not in ir.SIZES:
            report(
                span,
                f"unknown size '{size}'{_did_you_mean(size, ir.SIZES)}",
                note="a size is one of " + ", ".join(ir.SIZES) + ", or a positive integer",
            )
            ok = False
        elif isinstance(size, int) and not 1 <= size <= ir.MAX_INPUT_SIZE:
            report(span, f"a size must be between 1 and {ir.MAX_INPUT_SIZE}, got {size}")
            ok = False
    return ok


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _check_block_name(block: ir.Block, report: _Reporter) -> None:
    name = block.name
    if not _BLOCK_NAME.match(name):
        report(
            block.name_span,
            f"block name '{name}' must start with a letter and contain only "
            "letters, digits and '_'",
        )
    elif keyword.iskeyword(name):
        report(
            block.name_span,
            f"block name '{name}' is a Python keyword",
            note="block names become Python module names",
        )
    elif (why := reserved_block_name(name)) is not None:
        report(
            block.name_span,
            f"block name '{name}' is reserved: {why}",
            note=f"block names become Python module names (`{name}.py`), and a module "
            "of that name would shadow or be confused with it; names are compared "
            "ignoring case",
        )
    if len(name) > _BLOCK_NAME_MAX:
        report(
            block.name_span,
            f"block name is {len(name)} characters long; " f"the limit is {_BLOCK_NAME_MAX}",
        )


def reserved_block_name(name: str) -> str | None:
    """Why `name` cannot name a block (it would shadow or be confused with a
    module or name generated code relies on), or None if it can."""
    return _RESERVED_BLOCK_NAMES.get(name.casefold())


def _check_head_dim(value: ir.Expr, report: _Reporter, key: str = "head_dim") -> int | None:
    rule = f"`{key}` must be {_SETTING_RULES[key]}"
    head_dim = _Constants(report).integer(value, f"`{key}` must be an integer constant")
    if head_dim is None:
        return None
    if not (
        ir.HEAD_DIM_MIN <= head_dim <= ir.HEAD_DIM_MAX and head_dim % ir.HEAD_DIM_MULTIPLE == 0
    ):
        step = ir.HEAD_DIM_MULTIPLE
        below = min(max(head_dim // step * step, ir.HEAD_DIM_MIN), ir.HEAD_DIM_MAX)
        above = min(max(-(-head_dim // step) * step, ir.HEAD_DIM_MIN), ir.HEAD_DIM_MAX)
        nearest = " or ".join(str(v) for v in sorted({below, above}))
        report(value.span, f"{rule}, got {head_dim}", note=f"nearest valid: {nearest}")
        return None
    return head_dim


def _check_dtype(value: ir.Expr, report: _Reporter) -> ir.DType | None:
    valid = ", ".join(_DTYPES)
    if not isinstance(value, ir.Name):
        report(value.span, f"`dtype` must be one of {valid}, got `{print_expr(value)}`")
        return None
    if value.id not in _DTYPES:
        alias = _DTYPE_ALIASES.get(value.id)
        hint = f"; did you mean '{alias}'?" if alias else _did_you_mean(value.id, _DTYPES)
        report(
            value.span,
            f"unknown dtype '{value.id}'{hint}",
            note=f"valid dtypes: {valid}",
        )
        return None
    return ir.DType(value.id)


def _check_align(value: ir.Expr, report: _Reporter) -> ir.Align | None:
    valid = " or ".join(_ALIGNS)
    if not isinstance(value, ir.Name):
        report(value.span, f"`align` must be {valid}, got `{print_expr(value)}`")
        return None
    if value.id not in _ALIGNS:
        report(
            value.span,
            f"unknown alignment '{value.id}'{_did_you_mean(value.id, _ALIGNS)}",
            note=f"valid alignments: {valid}",
        )
        return None
    return ir.Align(value.id)


def _check_scale(value: ir.Expr, report: _Reporter) -> float | None:
    scale = _Constants(report).number(value, "`scale` must be a positive constant")
    if scale is None:
        return None
    if not scale > 0:
        report(value.span, f"`scale` must be a positive constant, got {scale!r}")
        return None
    if not _FLOAT32_MIN <= scale <= _LOG2E_FACTOR_MAX:
        report(
            value.span,
            f"`scale` must be between 2^-126 and {_LOG2E_FACTOR_MAX:.6g}, got {scale!r}",
            note=_LOG2E_FACTOR_NOTE.format(what="the scale"),
        )
        return None
    return float(scale)


def _check_rescale_threshold(value: ir.Expr, report: _Reporter) -> float | None:
    rule = f"`rescale_threshold` must be a constant between 0 and {ir.RESCALE_THRESHOLD_MAX}"
    threshold = _Constants(report).number(value, rule)
    if threshold is None:
        return None
    if not 0 <= threshold <= ir.RESCALE_THRESHOLD_MAX:
        report(
            value.span,
            f"{rule}, got {threshold!r}",
            note="the threshold is in log2 units; probabilities up to 2^threshold "
            "must fit the input dtype",
        )
        return None
    if 0 < threshold < _FLOAT32_MIN:
        report(
            value.span,
            f"`rescale_threshold` must be 0 or at least 2^-126, got {threshold!r}",
            note=_FLOAT32_NOTE,
        )
        return None
    return float(threshold) + 0.0  # no -0.0


def _check_mask(
    value: ir.Expr, report: _Reporter, inputs: Mapping[str, ir.Input], used: set[str]
) -> ir.Expr | None:
    checked = _Expressions(report, in_mask=True, inputs=inputs, used=used).check(value)
    if checked is None:
        return None
    expr, kind = checked
    if kind is not Kind.BOOL:
        report(
            value.span,
            f"the mask must be a boolean expression, got {_kind_words(kind)} expression",
            note="compare it, e.g. `q - k >= 0`",
        )
        return None
    if _report_first(_integer_problems(expr, tuple(inputs.values())), report):
        return None
    return expr


def _check_score(
    value: ir.Expr, report: _Reporter, inputs: Mapping[str, ir.Input], used: set[str]
) -> ir.Expr | None:
    checked = _Expressions(report, in_mask=False, inputs=inputs, used=used).check(value)
    if checked is None:
        return None
    expr = checked[0]
    integer_bad = _report_first(_integer_problems(expr, tuple(inputs.values())), report)
    real_bad = _report_first(_real_constant_problems(expr), report)
    return None if integer_bad or real_bad else expr


def _report_first(problems: list[tuple[ir.Span, str, str | None]], report: _Reporter) -> bool:
    """Report the first (innermost) problem of an expression, if any: the ones
    after it are mostly the same overflow seen from enclosing expressions."""
    if problems:
        report(*problems[0])
    return bool(problems)


_SETTING_CHECKERS: dict[str, Callable[..., object]] = {
    "head_dim": _check_head_dim,
    "v_head_dim": functools.partial(_check_head_dim, key="v_head_dim"),
    "dtype": _check_dtype,
    "scale": _check_scale,
    "mask": _check_mask,
    "score": _check_score,
    "align": _check_align,
    "rescale_threshold": _check_rescale_threshold,
}
assert set(_SETTING_CHECKERS) == set(ir.SETTINGS)


# --------------------------------------------------------------------------- #
# Constant folding
# --------------------------------------------------------------------------- #


class _NotConstant(Exception):
    def __init__(self, span: ir.Span, message: str) -> None:
        self.span = span
        self.message = message


class _Constants:
    """Evaluates constant expressions (literals, `+ - * / div %`, abs/min/max).

    `rule` in the public methods is the requirement being checked, phrased for
    the user ("the arguments of `window` must be integer constants"); every
    failure is reported against it and gives None.
    """

    def __init__(self, report: _Reporter) -> None:
        self.report = report

    def integer(self, e: ir.Expr, rule: str) -> int | None:
        value = self.number(e, rule)
        if value is None:
            return None
        if not isinstance(value, int):
            self.report(e.span, f"{rule}, got {value!r}")
            return None
        return value

    def number(self, e: ir.Expr, rule: str) -> int | float | None:
        try:
            value = self._eval(e)
        except _NotConstant as problem:
            self.report(problem.span, f"{rule}; {problem.message}")
            return None
        except OverflowError:
            self.report(e.span, f"{rule}; the value is too large")
            return None
        if isinstance(value, int) and abs(value) >= _INT32_LIMIT:
            self.report(e.span, f"{rule}; {value} does not fit in 32 bits")
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self.report(e.span, f"{rule}; the value is not finite")
            return None
        return value

    def _eval(self, e: ir.Expr) -> int | float:
        match e:
            case ir.Num(value=value):
                problem = _literal_problem(value)
                if problem:
                    raise _NotConstant(e.span, problem)
                return value
            case ir.Unary(op=ir.UnaryOp.NEG, operand=operand):
                return -self._eval(operand)
            case ir.Binary(op=op, left=left, right=right) if op in _ARITHMETIC:
                a, b = self._eval(left), self._eval(right)
                if op in (ir.BinOp.FLOORDIV, ir.BinOp.MOD):
                    if not (isinstance(a, int) and isinstance(b, int)):
                        raise _NotConstant(e.span, f"`{op.value}` needs integer operands")
                    if b <= 0:
                        raise _NotConstant(
                            right.span,
                            f"the right operand of `{op.value}` must be positive, got {b}",
                        )
                if op is ir.BinOp.DIV and b == 0:
                    raise _NotConstant(right.span, "division by zero")
                return _ARITHMETIC[op](a, b)
            case ir.Call(fn=fn, args=args) if (
                fn in ir.POLY_FUNCTIONS and len(args) == ir.POLY_FUNCTIONS[fn]
            ):
                values = [self._eval(a) for a in args]
                result = {"abs": abs, "min": min, "max": max}[fn](*values)
                # Like the kinds: one real argument makes the result real.
                return float(result) if any(isinstance(v, float) for v in values) else result
        raise _NotConstant(e.span, f"`{print_expr(e)}` is not a constant")


_ARITHMETIC: dict[ir.BinOp, Callable[[int | float, int | float], int | float]] = {
    ir.BinOp.ADD: lambda a, b: a + b,
    ir.BinOp.SUB: lambda a, b: a - b,
    ir.BinOp.MUL: lambda a, b: a * b,
    ir.BinOp.DIV: lambda a, b: a / b,
    ir.BinOp.FLOORDIV: lambda a, b: a // b,
    ir.BinOp.MOD: lambda a, b: a % b,
}


def _literal_problem(value: int | float) -> str | None:
    if isinstance(value, int) and abs(value) >= _INT32_LIMIT:
        return f"the integer literal {value} does not fit in 32 bits (|value| < 2^31)"
    if isinstance(value, float) and not math.isfinite(value):
        return "the real literal is too large"
    return None


# --------------------------------------------------------------------------- #
# Mask and score expressions
# --------------------------------------------------------------------------- #

_NAMED_MASK_MINIMUM = {
    "window": (0, "window size"),
    "prefix": (0, "prefix length"),
    "chunk": (1, "chunk size"),
}


class _Expressions:
    """Kind-checks a mask (`in_mask`) or score expression and folds its constants.

    `check` returns `(expr, kind)` or None; None means an error was reported
    in that subtree, and its parents report nothing more about it.
    """

    def __init__(
        self,
        report: _Reporter,
        *,
        in_mask: bool,
        inputs: Mapping[str, ir.Input] | None = None,
        used: set[str] | None = None,
    ) -> None:
        self.report = report
        self.in_mask = in_mask
        self.constants = _Constants(report)
        self.inputs = inputs or {}
        self.used = used if used is not None else set()
        self.in_index = False  # inside an index expression

    def check(self, e: ir.Expr) -> tuple[ir.Expr, Kind] | None:
        match e:
            case ir.Num():
                return self._num(e)
            case ir.Name():
                return self._name(e)
            case ir.Call():
                return self._call(e)
            case ir.Unary():
                return self._unary(e)
            case ir.Binary():
                return self._binary(e)
            case ir.Index():
                return self._index(e)
        raise TypeError(f"not an ir expression: {e!r}")

    # -- inputs -------------------------------------------------------------- #

    def _index(self, e: ir.Index) -> tuple[ir.Expr, Kind] | None:
        decl = self.inputs.get(e.input)
        if decl is None and e.input in self.used:  # declared, but not well: reported there
            self._check_all(e.args)
            return None
        if decl is None:
            if e.input in ir.INT_VARIABLES or e.input in (ir.SCORE_VARIABLE, ir.ALIBI):
                self.report(
                    e.span, f"`{e.input}` is not an input; only declared inputs are indexed"
                )
            else:
                hint = _did_you_mean(e.input, tuple(self.inputs))
                self.report(
                    e.span,
                    f"unknown input '{e.input}'{hint}",
                    note=None if hint else "declare it in the block, e.g. `doc: int32[B, Nk]`",
                )
            self._check_all(e.args)
            return None
        self.used.add(e.input)
        if len(e.args) != len(decl.shape):
            self.report(
                e.span,
                f"`{e.input}` has {_plural(len(decl.shape), 'dimension')}, "
                f"indexed with {_plural(len(e.args), 'index', 'indices')}",
                note=f"declared as `{print_input(decl)}`",
            )
            self._check_all(e.args)
            return None
        if self.in_index:
            self.report(e.span, "an index may not read an input")
            return None
        self.in_index = True
        try:
            args = [self._numeric(a, "[]") for a in e.args]
        finally:
            self.in_index = False
        if any(a is None for a in args):
            return None
        for arg, (_, kind) in zip(e.args, args):
            if kind is not Kind.INT:
                self.report(arg.span, f"an index must be an integer, got {_kind_words(kind)}")
                return None
        if not decl.element.is_integer and self.in_mask:
            self.report(e.span, f"{_MASK_KINDS}; `{e.input}` holds {decl.element.value} reals")
            return None
        kind = Kind.INT if decl.element.is_integer else Kind.REAL
        return replace(e, args=tuple(a[0] for a in args), element=decl.element), kind

    # -- leaves -------------------------------------------------------------- #

    def _num(self, e: ir.Num) -> tuple[ir.Expr, Kind] | None:
        problem = _literal_problem(e.value)
        if problem:
            self.report(e.span, problem)
            return None
        if isinstance(e.value, int):
            return e, Kind.INT
        if self.in_mask:
            self.report(e.span, f"{_MASK_KINDS}; {e.value!r} is a real number")
            return None
        return e, Kind.REAL

    def _name(self, e: ir.Name) -> tuple[ir.Expr, Kind] | None:
        name = e.id
        if name in ir.INT_VARIABLES:
            return e, Kind.INT
        if name in (ir.SCORE_VARIABLE, ir.ALIBI):
            if self.in_mask:
                self.report(
                    e.span,
                    f"{_MASK_KINDS}; `{name}` is only defined in the score",
                )
                return None
            return e, Kind.REAL
        if name in ir.NAMED_MASKS:
            if not self.in_mask:
                self.report(e.span, f"the mask `{name}` cannot be used in the score")
                return None
            return e, Kind.BOOL
        if name in _ALL_FUNCTIONS:
            self.report(e.span, f"`{name}` is a function; call it with arguments: {name}(...)")
            return None
        if name in self.inputs:
            rank = len(self.inputs[name].shape)
            self.report(
                e.span,
                f"`{name}` is an input; index it with {_plural(rank, 'index', 'indices')}: "
                f"{name}[{', '.join('...' for _ in range(rank))}]",
            )
            return None
        candidates = _MASK_NAMES if self.in_mask else _SCORE_NAMES
        self.report(e.span, f"unknown name '{name}'{_did_you_mean(name, candidates)}")
        return None

    # -- calls --------------------------------------------------------------- #

    def _call(self, e: ir.Call) -> tuple[ir.Expr, Kind] | None:
        fn = e.fn
        if fn in ir.MASK_FUNCTIONS:
            return self._named_mask(e)
        if fn == ir.SOFTCAP:
            return self._softcap(e)
        if fn in ir.REAL_FUNCTIONS or fn in ir.POLY_FUNCTIONS:
            return self._math_function(e)
        if fn in ir.INT_VARIABLES or fn in ir.NAMED_MASKS or fn in (ir.SCORE_VARIABLE, ir.ALIBI):
            self.report(e.span, f"`{fn}` is not a function")
        else:
            candidates = _MASK_FUNCTIONS if self.in_mask else _SCORE_FUNCTIONS
            self.report(e.span, f"unknown function '{fn}'{_did_you_mean(fn, candidates)}")
        self._check_all(e.args)
        return None

    def _arity_ok(self, e: ir.Call, low: int, high: int) -> bool:
        if low <= len(e.args) <= high:
            return True
        count = (
            f"{low}"
            if low == high
            else f"{low} or {high}" if high == low + 1 else f"{low} to {high}"
        )
        plural = "argument" if count == "1" else "arguments"
        self.report(e.span, f"`{e.fn}` takes {count} {plural}, got {len(e.args)}")
        return False

    def _named_mask(self, e: ir.Call) -> tuple[ir.Expr, Kind] | None:
        if not self.in_mask:
            self.report(e.span, f"the mask `{e.fn}` cannot be used in the score")
            return None
        low, high = ir.MASK_FUNCTIONS[e.fn]
        arity_ok = self._arity_ok(e, low, high)
        minimum, what = _NAMED_MASK_MINIMUM[e.fn]
        rule = f"the arguments of `{e.fn}` must be integer constants"
        args = []
        for arg in e.args:
            value = self.constants.integer(arg, rule)
            if value is None:
                continue
            if value < minimum:
                bound = "non-negative" if minimum == 0 else f"at least {minimum}"
                self.report(arg.span, f"{what} must be {bound}, got {value}")
                continue
            args.append(ir.Num(value, span=arg.span))
        if not arity_ok or len(args) != len(e.args):
            return None
        return replace(e, args=tuple(args)), Kind.BOOL

    def _softcap(self, e: ir.Call) -> tuple[ir.Expr, Kind] | None:
        if self.in_mask:
            self.report(e.span, f"{_MASK_KINDS}; `softcap` gives a real number")
            return None
        if not self._arity_ok(e, 2, 2):
            self._check_all(e.args)
            return None
        x = self._numeric(e.args[0], "softcap")
        rule = "the cap of `softcap` must be a positive constant"
        cap = self.constants.number(e.args[1], rule)
        if cap is not None and not cap > 0:
            self.report(e.args[1].span, f"{rule}, got {cap!r}")
            cap = None
        elif cap is not None and not _FLOAT32_MIN <= cap <= _LOG2E_FACTOR_MAX:
            self.report(
                e.args[1].span,
                f"the cap of `softcap` must be between 2^-126 and "
                f"{_LOG2E_FACTOR_MAX:.6g}, got {cap!r}",
                note=_LOG2E_FACTOR_NOTE.format(what="the cap"),
            )
            cap = None
        if x is None or cap is None:
            return None
        return (
            replace(e, args=(x[0], ir.Num(float(cap), span=e.args[1].span))),
            Kind.REAL,
        )

    def _math_function(self, e: ir.Call) -> tuple[ir.Expr, Kind] | None:
        real = e.fn in ir.REAL_FUNCTIONS
        if real and self.in_mask:
            self.report(e.span, f"{_MASK_KINDS}; `{e.fn}` gives a real number")
            return None
        arity = 1 if real else ir.POLY_FUNCTIONS[e.fn]
        arity_ok = self._arity_ok(e, arity, arity)
        args = [self._numeric(a, e.fn) for a in e.args]
        if not arity_ok or None in args:
            return None
        kind = Kind.REAL if real or any(k is Kind.REAL for _, k in args) else Kind.INT
        return replace(e, args=tuple(a for a, _ in args)), kind

    # -- operators ----------------------------------------------------------- #

    def _unary(self, e: ir.Unary) -> tuple[ir.Expr, Kind] | None:
        if e.op is ir.UnaryOp.NOT:
            if not self.in_mask:
                self.report(e.span, "`!` is only allowed in the mask")
                self.check(e.operand)
                return None
            operand = self._boolean(e.operand, "!")
            return None if operand is None else (replace(e, operand=operand), Kind.BOOL)
        operand = self._numeric(e.operand, "-")
        return None if operand is None else (replace(e, operand=operand[0]), operand[1])

    def _binary(self, e: ir.Binary) -> tuple[ir.Expr, Kind] | None:
        op = e.op
        if op in (ir.BinOp.AND, ir.BinOp.OR):
            if not self.in_mask:
                self.report(
                    e.span,
                    f"`{op.value}` combines masks and is not allowed in the score",
                )
                self._check_all((e.left, e.right))
                return None
            left, right = self._boolean(e.left, op.value), self._boolean(e.right, op.value)
            if left is None or right is None:
                return None
            return replace(e, left=left, right=right), Kind.BOOL
        if op in ir.COMPARISONS:
            if not self.in_mask:
                self.report(e.span, "comparisons are only allowed in the mask")
                self._check_all((e.left, e.right))
                return None
            left, right = self._numeric(e.left, op.value), self._numeric(e.right, op.value)
            if left is None or right is None:
                return None
            return replace(e, left=left[0], right=right[0]), Kind.BOOL
        if op is ir.BinOp.DIV and self.in_mask:
            self.report(
                e.span,
                f"{_MASK_KINDS}; `/` gives a real number",
                note="use `div` for floor division of integers",
            )
            self._check_all((e.left, e.right))
            return None
        if op in (ir.BinOp.FLOORDIV, ir.BinOp.MOD):
            return self._floor_division(e)
        left, right = self._numeric(e.left, op.value), self._numeric(e.right, op.value)
        if left is None or right is None:
            return None
        if op is ir.BinOp.DIV:
            kind = Kind.REAL
            if _is_constant_zero(right[0]):
                self.report(e.right.span, "division by zero")
                return None
        elif Kind.REAL in (left[1], right[1]):
            kind = Kind.REAL
        else:
            kind = Kind.INT
        return replace(e, left=left[0], right=right[0]), kind

    def _floor_division(self, e: ir.Binary) -> tuple[ir.Expr, Kind] | None:
        symbol = e.op.value
        left = self._numeric(e.left, symbol)
        if left is not None and left[1] is not Kind.INT:
            self.report(e.left.span, f"`{symbol}` needs integer operands, got a real")
            left = None
        rule = f"the right operand of `{symbol}` must be a positive integer constant"
        divisor = self.constants.integer(e.right, rule)
        if divisor is not None and divisor <= 0:
            self.report(e.right.span, f"{rule}, got {divisor}")
            divisor = None
        if left is None or divisor is None:
            return None
        return (
            replace(e, left=left[0], right=ir.Num(divisor, span=e.right.span)),
            Kind.INT,
        )

    # -- operand kinds ------------------------------------------------------- #

    def _numeric(self, e: ir.Expr, user: str) -> tuple[ir.Expr, Kind] | None:
        checked = self.check(e)
        if checked is not None and checked[1] is Kind.BOOL:
            self.report(e.span, f"`{user}` needs a number, got a boolean")
            return None
        return checked

    def _boolean(self, e: ir.Expr, user: str) -> ir.Expr | None:
        checked = self.check(e)
        if checked is None:
            return None
        if checked[1] is not Kind.BOOL:
            self.report(
                e.span,
                f"`{user}` needs a boolean, got {_kind_words(checked[1])}",
                note="compare integers to get a boolean, e.g. `q - k >= 0`",
            )
            return None
        return checked[0]

    def _check_all(self, exprs: Sequence[ir.Expr]) -> None:
        """Check operands of an already-rejected node, for their own errors."""
        for expr in exprs:
            self.check(expr)


def _is_constant_zero(e: ir.Expr) -> bool:
    # A throwaway reporter: an expression that does not fold is just not zero.
    return _Constants(_Reporter("")).number(e, "") == 0


# --------------------------------------------------------------------------- #
# Expression size
# --------------------------------------------------------------------------- #


def _size_problem(e: ir.Expr) -> tuple[ir.Span, str, str] | None:
    """(where, message, note) for the first node, in source order, that lies
    deeper than `ir.MAX_EXPR_DEPTH` levels or past `ir.MAX_EXPR_NODES` nodes;
    None within the limits.  Walks with an explicit stack."""
    nodes = 0
    stack = [(e, 0)]
    while stack:
        node, level = stack.pop()
        nodes += 1
        children: tuple[ir.Expr, ...] = ()
        if isinstance(node, ir.Binary):
            children = (node.left, node.right)
        elif isinstance(node, ir.Unary):
            children = (node.operand,)
        elif isinstance(node, (ir.Call, ir.Index)):
            children = node.args
        if isinstance(node, (ir.Binary, ir.Unary, ir.Call, ir.Index)):
            level += 1
            if level > ir.MAX_EXPR_DEPTH:
                return (node.span, *expression_too_deep())
        if nodes > ir.MAX_EXPR_NODES:
            return (node.span, *expression_too_large())
        stack.extend((child, level) for child in reversed(children))
    return None


# --------------------------------------------------------------------------- #
# Integer ranges
# --------------------------------------------------------------------------- #

_INT_LIMIT = ir.INT_MAGNITUDE_MAX
_INT_RULE = (
    f"integer expressions must stay within ±{'2^%d' % (_INT_LIMIT.bit_length() - 1)} "
    f"for sequences of up to {ir.MAX_SEQ_LEN} positions"
)
_INT_NOTE = (
    "kernels compute integers in 32 bits; the bound takes |q| and |k| up to "
    f"{ir.POSITION_BOUND} (positions, with padding) and h and H up to {ir.MAX_HEADS}"
)
# Largest arguments of the named masks whose definitions stay within the
# limit (see `_Magnitudes._named_mask`).
WINDOW_MAX = _INT_LIMIT - 2 * ir.POSITION_BOUND
PREFIX_MAX = _INT_LIMIT - ir.POSITION_BOUND
CHUNK_MAX = _INT_LIMIT - ir.POSITION_BOUND
# Every position lies in [-(MAX_SEQ_LEN - 1), MAX_SEQ_LEN - 1], so two differ
# by at most this much.
_SPAN_MAX = ir.MAX_SEQ_LEN - 1

Problem = tuple[ir.Span, str, "str | None"]


def integer_magnitude(e: ir.Expr) -> int | None:
    """A bound on |e| over every position and head count a generated module
    accepts, for `e` an expression of a checked mask or score: None when `e`
    is real or boolean."""
    return _Magnitudes().bound(e)


def _integer_problems(e: ir.Expr, inputs: Sequence[ir.Input] = ()) -> list[Problem]:
    """Every integer quantity a kernel computes for `e` that can leave
    ±ir.INT_MAGNITUDE_MAX, innermost first."""
    magnitudes = _Magnitudes(inputs)
    magnitudes.bound(e)
    return magnitudes.problems


def _interval(e: ir.Expr) -> tuple[int, int] | None:
    """Sound bounds lo <= e <= hi of an integer expression of a checked spec over
    every position, head and batch index a module accepts (signed, unlike
    `_Magnitudes`' M(e)): `index_ranges`' interval analysis with no guard, or
    None where it has no interval form (a read of an input)."""
    try:
        node = index_ranges.encode(e, None)
    except ValueError:
        return None
    env = {"b": (0, ir.MAX_BATCH), "h": (0, ir.MAX_HEADS), "H": (0, ir.MAX_HEADS)}
    positions = (-ir.POSITION_BOUND, ir.POSITION_BOUND)
    return index_ranges.interval(node, index_ranges.OPEN, positions, positions, env)


class _Magnitudes:
    """Sound bounds M(e) >= |e| for the integer subexpressions of a checked
    expression, propagated bottom-up: M(q) = M(k) = ir.POSITION_BOUND,
    M(h) = M(H) = ir.MAX_HEADS, M(a + b) = M(a) + M(b), M(a * b) = M(a) M(b),
    and so on.  Besides every integer subexpression, it bounds what lowering
    derives from them: the difference of the two sides of each comparison
    (lowering rewrites a comparison as one affine expression and evaluates
    partial sums of its terms at tile corners, each bounded by M(left) +
    M(right)), the numerator that `div` and `%` shift by up to the divisor,
    and the definitions of the named masks.  `problems` collects each bound
    over the limit, children before parents."""

    def __init__(self, inputs: Sequence[ir.Input] = ()) -> None:
        self.problems: list[Problem] = []
        # Integer inputs: the largest magnitude their element type holds.
        self.input_bounds = {
            i.name: 2**31 if i.element is ir.Element.INT32 else 2**63
            for i in inputs
            if i.element.is_integer
        }

    def bound(self, e: ir.Expr) -> int | None:
        match e:
            case ir.Num(value=value):
                if isinstance(value, float):
                    return None
                if abs(value) > _INT_LIMIT:
                    self.problems.append(
                        (e.span, f"the integer {value} is too large; {_INT_RULE}", _INT_NOTE)
                    )
                return abs(value)
            case ir.Name(id=name):
                if name in ("q", "k"):
                    return ir.POSITION_BOUND
                if name in ("h", "H"):
                    return ir.MAX_HEADS
                if name == "b":
                    return ir.MAX_BATCH
                return None
            case ir.Index(args=args):
                for a in args:
                    self.bound(a)
                return self.input_bounds.get(e.input)
            case ir.Unary(op=ir.UnaryOp.NEG, operand=operand):
                return self.bound(operand)
            case ir.Unary(operand=operand):
                self.bound(operand)
                return None
            case ir.Binary(op=op, left=left, right=right):
                return self._binary(e, op, left, right)
            case ir.Call(fn=fn, args=args) if fn in ir.MASK_FUNCTIONS:
                self._named_mask(e)
                return None
            case ir.Call(fn=fn, args=args):
                bounds = [self.bound(a) for a in args]
                if fn in ir.POLY_FUNCTIONS and None not in bounds:
                    # abs, min, max: within their arguments' bounds, and within
                    # the signed interval of their value where it is tighter
                    # (`min(max(q - k - 18, 0), 1)` is 0 or 1, not up to 2^26).
                    span = _interval(e)
                    tight = max(bounds) if span is None else max(-span[0], span[1])
                    return min(max(bounds), tight)
                return None
        raise TypeError(f"not an ir expression: {e!r}")

    def _binary(self, e: ir.Binary, op: ir.BinOp, left: ir.Expr, right: ir.Expr) -> int | None:
        if op in (ir.BinOp.FLOORDIV, ir.BinOp.MOD):
            a = self.bound(left)
            c = right.value  # a folded positive literal  # type: ignore[union-attr]
            # `_floor_div` moves a negative numerator down by c - 1, and `%`
            # subtracts the quotient times c: both within M(a) + c.
            self._within(e, a + c, f"computing `{_text(e)}` takes values up to")
            return a // c + 1 if op is ir.BinOp.FLOORDIV else c - 1
        a, b = self.bound(left), self.bound(right)
        if a is None or b is None:
            return None
        if op in ir.COMPARISONS:
            # A comparison that reads an input is evaluated as it stands (in 64
            # bits); the others are rewritten as differences (see above).
            if not ir.reads_inputs(e):
                self._within(e, a + b, f"the two sides of `{_text(e)}` can differ by")
            return None
        if op in (ir.BinOp.ADD, ir.BinOp.SUB):
            return self._within(e, a + b)
        if op is ir.BinOp.MUL:
            return self._within(e, a * b)
        return None  # `/` gives a real

    def _within(self, e: ir.Expr, magnitude: int, what: str | None = None) -> int:
        if ir.reads_inputs(e):
            if magnitude > ir.INPUT_MAGNITUDE_MAX:
                what = what or f"`{_text(e)}` can reach"
                self.problems.append(
                    (
                        e.span,
                        f"{what} {_power_words(magnitude)}; integer expressions that read "
                        f"inputs must stay within ±2^62",
                        "they are computed in 64 bits; an input of int32 holds values up "
                        "to 2^31, one of int64 up to 2^63",
                    )
                )
        elif magnitude > _INT_LIMIT:
            what = what or f"`{_text(e)}` can reach"
            self.problems.append(
                (e.span, f"{what} {_power_words(magnitude)}; {_INT_RULE}", _INT_NOTE)
            )
        return magnitude

    def _named_mask(self, e: ir.Call) -> None:
        """window(L, R) is q - L <= k <= q + R: k - (q - L) is within
        2 M(q) + L; prefix(P) is k < P, within M(k) + P; chunk(C) is
        q div C == k div C, whose numerators reach M(q) + C."""
        values = [a.value for a in e.args]  # folded literals  # type: ignore[union-attr]
        largest = {"window": WINDOW_MAX, "prefix": PREFIX_MAX, "chunk": CHUNK_MAX}[e.fn]
        what = {"window": "window size", "prefix": "prefix length", "chunk": "chunk size"}[e.fn]
        for index, (arg, value) in enumerate(zip(e.args, values)):
            if value > largest:
                self.problems.append(
                    (
                        arg.span,
                        f"{what} {value} is too large; the largest accepted is {largest}",
                        _named_mask_note(e.fn, values, index),
                    )
                )


def _named_mask_note(fn: str, values: list[int], index: int) -> str:
    """Why a named-mask argument is bounded, and what to write instead."""
    n = ir.MAX_SEQ_LEN
    why = "kernels compute the mask's integers in 32 bits, within ±2^30; "
    if fn == "prefix":
        return (
            why
            + f"a prefix of {n} or more keys holds every key, so `prefix({values[0]})` is `full`"
        )
    if fn == "chunk":
        return (
            why + f"a chunk of {n} or more positions holds all of 0 to {n - 1}, so "
            f"`chunk({values[0]})` is `q >= 0`"
        )
    left, right = values if len(values) == 2 else (values[0], 0)
    open_left = index == 0 or left >= _SPAN_MAX
    open_right = index == 1 or right >= _SPAN_MAX
    if open_left and open_right:
        instead = "full"
    elif open_left:
        instead = "causal" if right == 0 else f"k <= q + {right}"
    else:
        instead = f"q - {left} <= k" if left else "q <= k"
    written = "window(" + ", ".join(str(v) for v in values) + ")"
    return (
        why + f"a window of {_SPAN_MAX} or more keys on a side hides nothing on that side "
        f"in sequences of up to {n} positions, so `{written}` is `{instead}`"
    )


def _power_words(n: int) -> str:
    if n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    if n < 10**12:
        return str(n)
    return f"about 2^{math.log2(n):.1f}"


def _text(e: ir.Expr) -> str:
    text = print_expr(e)
    return text if len(text) <= 60 else text[:56] + " ..."


# --------------------------------------------------------------------------- #
# Real constants
# --------------------------------------------------------------------------- #

# Kernels compute scores in float32.  A real constant must be 0 or a normal
# float32: subnormals are flushed to zero on GPUs.
_FLOAT32_MIN = 2.0**-126
_FLOAT32_MAX = (2 - 2.0**-23) * 2.0**127  # 3.4028234663852886e38
# Kernels work in base 2 and fold log2(e) into the scale and softcap caps.
_LOG2E = math.log2(math.e)
_LOG2E_FACTOR_MAX = _FLOAT32_MAX / _LOG2E
_FLOAT32_NOTE = (
    "kernels compute in float32: real constants must be 0 or between 2^-126 "
    f"(about 1.18e-38) and {_FLOAT32_MAX!r} in magnitude"
)
_LOG2E_FACTOR_NOTE = (
    "kernels compute in float32 and multiply {what} by log2(e) = 1.4427: it must be "
    f"at least 2^-126 (about 1.18e-38, float32's smallest normal number) and at most "
    f"{_FLOAT32_MAX!r} / log2(e) = {_LOG2E_FACTOR_MAX!r}"
)


def _in_float32(x: float) -> bool:
    return x == 0 or _FLOAT32_MIN <= abs(x) <= _FLOAT32_MAX


def _real_constant_problems(e: ir.Expr) -> list[Problem]:
    """Every constant subexpression of a checked score that folds to a real
    outside float32's range (or to no number at all), innermost first."""
    problems: list[Problem] = []
    _fold(e, problems)
    return problems


def _fold(e: ir.Expr, problems: list[Problem]) -> int | float | None:
    """The value of `e` when it is constant, else None; appends to `problems`
    each real constant out of range, children before parents."""
    value: int | float | None
    match e:
        case ir.Num(value=value):
            pass
        case ir.Unary(op=ir.UnaryOp.NEG, operand=operand):
            inner = _fold(operand, problems)
            return None if inner is None else -inner
        case ir.Binary(op=op, left=left, right=right):
            a, b = _fold(left, problems), _fold(right, problems)
            if a is None or b is None or op not in _ARITHMETIC:
                return None
            try:
                value = _ARITHMETIC[op](a, b)
            except OverflowError:  # an integer too large for a float
                value = math.inf
            except ZeroDivisionError:  # reported by the kind check already
                return None
        case ir.Call(fn=fn, args=args):
            values = [_fold(a, problems) for a in args]
            if None in values:
                return None
            if fn in ir.POLY_FUNCTIONS:
                value = {"abs": abs, "min": min, "max": max}[fn](*values)
                if any(isinstance(v, float) for v in values):
                    value = float(value)
            elif fn in ir.REAL_FUNCTIONS:
                value = _real_function(fn, float(values[0]))
            else:
                return None
        case _:
            return None
    if isinstance(value, float) and not _in_float32(value):
        if isinstance(e, ir.Num):
            message = (
                f"the real {_text(e)} is outside the range of float32, which kernels compute in"
            )
        elif not math.isfinite(value):
            message = f"`{_text(e)}` is not a finite number"
        else:
            message = f"`{_text(e)}` is {value:.6g}, outside the range of float32, which kernels compute in"
        problems.append((e.span, message, _FLOAT32_NOTE))
    return value


def _real_function(fn: str, x: float) -> float:
    if fn == "tanh":
        return math.tanh(x)
    if fn == "exp":
        return math.exp(x) if x < 710 else math.inf
    if fn == "log":
        return math.log(x) if x > 0 else -math.inf if x == 0 else math.nan
    return math.sqrt(x) if x >= 0 else math.nan
