"""FlexAttention's `score_mod` and `mask_mod` for a spec, from its IR.

In: a checked `Variant` and the problem's shape (Nq, Nk, H).  Out: the two
callables that `torch.nn.attention.flex_attention` takes, computing the same
attention as flashgen's kernels, so that `flashgen bench` can time both on the
same variant and check that their outputs agree (a cross-check of our reading
of the language against an independent implementation).

The callables interpret the IR with torch operations; `torch.compile` traces
through them like any hand-written mod.  FlexAttention passes raw indices:
a query index is a position only under top-left alignment, so bottom-right
specs shift it by Nk - Nq here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

import operator

import torch

from flashgen import ir
from flashgen.reference import alibi_slopes

# Python operators accept a tensor or a plain number on either side; on
# tensors `//` and `%` round toward negative infinity, as the language does.
_ARITH = {
    ir.BinOp.ADD: operator.add,
    ir.BinOp.SUB: operator.sub,
    ir.BinOp.MUL: operator.mul,
    ir.BinOp.DIV: operator.truediv,
    ir.BinOp.FLOORDIV: operator.floordiv,
    ir.BinOp.MOD: operator.mod,
    ir.BinOp.EQ: operator.eq,
    ir.BinOp.NE: operator.ne,
    ir.BinOp.LT: operator.lt,
    ir.BinOp.LE: operator.le,
    ir.BinOp.GT: operator.gt,
    ir.BinOp.GE: operator.ge,
    ir.BinOp.AND: operator.and_,
    ir.BinOp.OR: operator.or_,
}
_FUNCTIONS = {
    "tanh": torch.tanh,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "abs": torch.abs,
    "min": torch.minimum,
    "max": torch.maximum,
}


@dataclass(frozen=True)
class FlexMods:
    score_mod: Callable | None  # None when the score is plain `s`
    mask_mod: Callable | None  # None when the mask is `full`


def _is_real(x) -> bool:
    return isinstance(x, float) or (torch.is_tensor(x) and x.is_floating_point())


def _real(x, env):
    """Integers become reals of the score's dtype, as in the reference."""
    if torch.is_tensor(x):
        return x if x.is_floating_point() else x.to(env["real"])
    return float(x)


def flex_mods(
    variant: ir.Variant,
    n_queries: int,
    n_keys: int,
    num_heads: int,
    device="cuda",
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> FlexMods:
    """`inputs`: the variant's declared inputs by name, captured by the mods
    (FlexAttention's way of reading runtime data; `b` is its batch index)."""
    offset = n_keys - n_queries if variant.align is ir.Align.BOTTOM_RIGHT else 0
    slopes = alibi_slopes(num_heads).to(device=device, dtype=torch.float32)
    inputs = dict(inputs or {})

    def read(e: ir.Index, env: dict):
        """The input's element, indices clamped into its shape: an index out
        of range matters only where the mask hides the pair (or `&`, `|` do
        not read it), and Flex evaluates the mods everywhere."""
        tensor = inputs[e.input]
        index = []
        for arg, size in zip(e.args, tensor.shape):
            x = evaluate(arg, env)
            index.append(x.clamp(0, size - 1) if torch.is_tensor(x) else min(max(x, 0), size - 1))
        value = tensor[tuple(index)]
        return value.to(torch.int64) if not value.is_floating_point() else value.to(env["real"])

    def evaluate(e: ir.Expr, env: dict):
        if isinstance(e, ir.Num):
            return e.value
        if isinstance(e, ir.Index):
            return read(e, env)
        if isinstance(e, ir.Name):
            if e.id == "full":
                return torch.ones_like(env["k"], dtype=torch.bool)
            if e.id == "causal":
                return env["k"] <= env["q"]
            if e.id == ir.ALIBI:
                return -slopes[env["h"]] * torch.abs(env["q"] - env["k"])
            return env[e.id]
        if isinstance(e, ir.Unary):
            x = evaluate(e.operand, env)
            if e.op is ir.UnaryOp.NOT:
                return torch.logical_not(x) if torch.is_tensor(x) else not x
            return -x
        if isinstance(e, ir.Binary):
            a, b = evaluate(e.left, env), evaluate(e.right, env)
            if e.op is ir.BinOp.DIV or _is_real(a) or _is_real(b):
                a, b = _real(a, env), _real(b, env)
            return _ARITH[e.op](a, b)
        args = [evaluate(a, env) for a in e.args]
        q, k = env["q"], env["k"]
        if e.fn == "window":
            left, right = args[0], args[1] if len(args) > 1 else 0
            return (k >= q - left) & (k <= q + right)
        if e.fn == "prefix":
            return k < args[0]
        if e.fn == "chunk":
            c = args[0]
            return q // c == k // c
        if e.fn == ir.SOFTCAP:
            x, cap = args
            return cap * torch.tanh(x / cap)
        fn = _FUNCTIONS[e.fn]
        if e.fn in ("min", "max"):
            if any(_is_real(x) for x in args):
                args = [_real(x, env) for x in args]
            a, b = (x if torch.is_tensor(x) else torch.tensor(x, device=device) for x in args)
            return fn(a, b)
        if e.fn == "abs":
            x = args[0]
            return fn(x if torch.is_tensor(x) else torch.tensor(x, device=device))
        return fn(_real(args[0], env))

    def env(b, h, q_idx, kv_idx, score=None):
        real = score.dtype if score is not None else torch.float32
        return {
            "q": q_idx + offset, "k": kv_idx, "h": h, "H": num_heads, "b": b, "s": score,
            "real": real,
        }  # fmt: skip

    def score_mod(score, b, h, q_idx, kv_idx):
        return evaluate(variant.score, env(b, h, q_idx, kv_idx, score)) + torch.zeros_like(score)

    def mask_mod(b, h, q_idx, kv_idx):
        visible = evaluate(variant.mask, env(b, h, q_idx, kv_idx))
        if not torch.is_tensor(visible):  # a constant mask such as `0 <= 10`
            visible = torch.full_like(kv_idx, bool(visible), dtype=torch.bool)
        return visible

    return FlexMods(
        score_mod if variant.score != ir.IDENTITY_SCORE else None,
        mask_mod if variant.mask != ir.FULL else None,
    )
