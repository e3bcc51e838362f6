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
* `head_dim` is an int; `scale` (when set) and `rescale_threshold` are floats.
* Defaults: mask `ir.FULL`, score `ir.IDENTITY_SCORE`, align bottom_right,
  rescale_threshold 0.0, scale None.

`div` is floor division and `%` its remainder, so with the positive divisor
that is required here `%` always lies in [0, divisor).
"""

from __future__ import annotations

import difflib
import keyword
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from flashgen import ir
from flashgen.diagnostics import Diagnostic
from flashgen.printer import print_expr

__all__ = ["check"]

Kind = ir.Kind

_INT32_LIMIT = 2**31
# Block names become Python module and file names.  (The language's own
# keywords, `attention` and `div`, never get here: the parser refuses them.)
_BLOCK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_BLOCK_NAME_MAX = 64

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
    "dtype": "one of " + ", ".join(_DTYPES),
}


def check(
    files: Sequence[ir.SpecFile],
) -> tuple[tuple[ir.Variant, ...], list[Diagnostic]]:
    """Check all blocks of all files; see the module docstring for the contract."""
    variants: list[ir.Variant] = []
    diagnostics: list[Diagnostic] = []
    first_by_name: dict[str, tuple[str, ir.Block]] = {}
    first_by_folded_name: dict[str, tuple[str, ir.Block]] = {}
    for spec in files:
        file_diagnostics: list[Diagnostic] = []
        for block in spec.blocks:
            report = _Reporter(spec.path)
            variant = _check_block(block, report)
            _check_unique_name(block, spec.path, first_by_name, first_by_folded_name, report)
            file_diagnostics += report.diagnostics
            if variant is not None and not report.diagnostics:
                variants.append(variant)
        diagnostics += sorted(file_diagnostics, key=_position)
    return tuple(variants), diagnostics


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


def _check_block(block: ir.Block, report: _Reporter) -> ir.Variant | None:
    _check_block_name(block, report)
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
    return ir.Variant(
        name=block.name,
        head_dim=values["head_dim"],
        dtype=values["dtype"],
        mask=values.get("mask", ir.FULL),
        score=values.get("score", ir.IDENTITY_SCORE),
        scale=values.get("scale"),
        align=values.get("align", ir.Align.BOTTOM_RIGHT),
        rescale_threshold=values.get("rescale_threshold", 0.0),
        span=block.span,
        path=report.path,
    )


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
    if len(name) > _BLOCK_NAME_MAX:
        report(
            block.name_span,
            f"block name is {len(name)} characters long; " f"the limit is {_BLOCK_NAME_MAX}",
        )


def _check_head_dim(value: ir.Expr, report: _Reporter) -> int | None:
    rule = f"`head_dim` must be {_SETTING_RULES['head_dim']}"
    head_dim = _Constants(report).integer(value, "`head_dim` must be an integer constant")
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
    return float(threshold) + 0.0  # no -0.0


def _check_mask(value: ir.Expr, report: _Reporter) -> ir.Expr | None:
    checked = _Expressions(report, in_mask=True).check(value)
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
    return expr


def _check_score(value: ir.Expr, report: _Reporter) -> ir.Expr | None:
    checked = _Expressions(report, in_mask=False).check(value)
    return None if checked is None else checked[0]


_SETTING_CHECKERS: dict[str, Callable[[ir.Expr, _Reporter], object]] = {
    "head_dim": _check_head_dim,
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

    def __init__(self, report: _Reporter, *, in_mask: bool) -> None:
        self.report = report
        self.in_mask = in_mask
        self.constants = _Constants(report)

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
        raise TypeError(f"not an ir expression: {e!r}")

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
