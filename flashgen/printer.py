"""Printing: ir expressions and checked Variants in, canonical `.attn` text out.

`print_expr` writes an expression with the fewest parentheses that parse back
to the same tree (left-associative binary operators, non-associative
comparisons; see grammars/attn.lark for the precedence ladder).
`print_variant` writes one block in normal form: four-space indent, the
input declarations in their order, then one setting per line in `ir.SETTINGS` order, every setting spelled out except
`scale` and `v_head_dim`, which appear only when set.  Integers print with `str`, reals with
`repr(float)` (infinity, which `parse` makes of a literal such as `1e999`, as
`1e999`), so `parse` of the output gives back equal values.

For a checked Variant, parse -> check of `print_variant(v)` gives back `v`
(tests/test_roundtrip.py).  Imports nothing of ours but `ir`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from flashgen import ir

__all__ = ["print_expr", "print_input", "print_variant", "print_file"]

# Binding strength, loosest first; mirrors the grammar's rule ladder.
_OR, _AND, _NOT, _COMPARE, _SUM, _PRODUCT, _NEGATION, _ATOM = range(8)

_BINARY_PRECEDENCE = {
    ir.BinOp.OR: _OR,
    ir.BinOp.AND: _AND,
    **{op: _COMPARE for op in ir.COMPARISONS},
    ir.BinOp.ADD: _SUM,
    ir.BinOp.SUB: _SUM,
    ir.BinOp.MUL: _PRODUCT,
    ir.BinOp.DIV: _PRODUCT,
    ir.BinOp.FLOORDIV: _PRODUCT,
    ir.BinOp.MOD: _PRODUCT,
}


def print_expr(e: ir.Expr) -> str:
    """`e` as `.attn` source text with minimal parentheses."""
    return _expr(e, _OR)


def print_variant(v: ir.Variant) -> str:
    """One `attention` block in normal form, newline-terminated."""
    values = {
        "head_dim": str(v.head_dim),
        "v_head_dim": None if v.v_head_dim is None else str(v.v_head_dim),
        "dtype": v.dtype.value,
        "scale": None if v.scale is None else _real(float(v.scale)),
        "mask": print_expr(v.mask),
        "score": print_expr(v.score),
        "align": v.align.value,
        "rescale_threshold": _real(float(v.rescale_threshold)),
    }
    lines = [f"attention {v.name} {{"]
    lines += [f"    {print_input(i)}" for i in v.inputs]
    lines += [f"    {key} = {values[key]}" for key in ir.SETTINGS if values[key] is not None]
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_input(i: ir.Input) -> str:
    """An input declaration, e.g. `rel: learnable fp32[H, 32]`."""
    learnable = "learnable " if i.learnable else ""
    return f"{i.name}: {learnable}{i.element.value}[{', '.join(map(str, i.shape))}]"


def print_file(variants: Iterable[ir.Variant]) -> str:
    """Blocks in the order given, separated by blank lines."""
    return "\n".join(print_variant(v) for v in variants)


def _expr(e: ir.Expr, context: int) -> str:
    """`e` printed where the grammar needs at least precedence `context`."""
    text, precedence = _unparenthesized(e)
    return f"({text})" if precedence < context else text


def _unparenthesized(e: ir.Expr) -> tuple[str, int]:
    match e:
        case ir.Num(value=value):
            if isinstance(value, int) and not isinstance(value, bool):
                text = str(value)
            else:
                text = _real(float(value))
            # A negative literal never comes out of `parse` (it reads `-3` as
            # negation), but print one as the negation it reads back as.
            return text, _NEGATION if text.startswith("-") else _ATOM
        case ir.Name(id=name):
            return name, _ATOM
        case ir.Call(fn=fn, args=args):
            return f"{fn}({', '.join(_expr(a, _OR) for a in args)})", _ATOM
        case ir.Index(input=name, args=args):
            return f"{name}[{', '.join(_expr(a, _OR) for a in args)}]", _ATOM
        case ir.Unary(op=ir.UnaryOp.NEG, operand=operand):
            return f"-{_expr(operand, _NEGATION)}", _NEGATION
        case ir.Unary(op=ir.UnaryOp.NOT, operand=operand):
            return f"!{_expr(operand, _NOT)}", _NOT
        case ir.Binary(op=op, left=left, right=right):
            precedence = _BINARY_PRECEDENCE[op]
            # Left-associative: the left operand may sit at the same level,
            # the right one must bind tighter.  Comparisons do not associate.
            left_context = precedence + 1 if precedence == _COMPARE else precedence
            text = f"{_expr(left, left_context)} {op.value} {_expr(right, precedence + 1)}"
            return text, precedence
    raise TypeError(f"not an ir expression: {e!r}")


def _real(value: float) -> str:
    if math.isinf(value):
        # `parse` reads a literal too large for a float, such as `1e999`, as
        # infinity; print it as one that reads back the same, so that any
        # tree `parse` gives (and `check` then reports on) can be shown.
        return "-1e999" if value < 0 else "1e999"
    if math.isnan(value):
        raise ValueError("cannot print NaN: no `.attn` literal reads as it")
    return repr(value)
