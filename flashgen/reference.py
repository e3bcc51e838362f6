"""Dense reference attention: the correctness spec the kernels are tested against.

In: a checked `ir.Variant` and dense torch tensors.  Out: the boolean mask, the
scores, and the attention output with its log-sum-exp, computed the obvious way
(materialize every (q, k) pair, softmax, matmul).

This module reads only the IR and shares no code with the kernel generator, so
a misreading of the language in one of them shows up as a test failure instead
of cancelling out.  Integer parts of an expression (positions, head indices,
`div`, `%`) are evaluated exactly in int64; real parts in the requested dtype.

Shapes: q (B, H, Nq, D); k and v (B, Hkv, Nk, D) with Hkv dividing H, query head
h reading kv head h // (H // Hkv).  `rows` (optional, everywhere) restricts the
result to those query rows, indices into Nq: each keeps the position it has in
the full problem, so a band of rows around a mask edge of a long sequence costs
len(rows) * Nk instead of Nq * Nk.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from collections.abc import Mapping
from typing import Callable

import torch

from flashgen import index_ranges, ir

__all__ = [
    "alibi_slopes",
    "check_inputs",
    "input_dtype",
    "input_shape",
    "positions",
    "mask_matrix",
    "scores",
    "attention_ref",
]


# --------------------------------------------------------------------------- #
# Positions and ALiBi slopes
# --------------------------------------------------------------------------- #


def _slopes_power_of_two(n: int) -> list[float]:
    return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes for `num_heads` query heads, float64 of shape (num_heads,).

    For a power of two H: slope_i = 2^(-8 (i + 1) / H).  Otherwise, with
    n = 2^floor(log2 H): the n slopes for n heads, then slopes 0, 2, 4, ... of
    the rule for 2n heads until H slopes in all (ALiBi paper code, HF BLOOM).
    """
    if num_heads < 1:
        raise ValueError(f"num_heads must be positive, got {num_heads}")
    n = 1 << (num_heads.bit_length() - 1)  # largest power of two <= num_heads
    slopes = _slopes_power_of_two(n)
    if n != num_heads:
        slopes += _slopes_power_of_two(2 * n)[0::2][: num_heads - n]
    return torch.tensor(slopes, dtype=torch.float64)


def positions(
    nq: int,
    nk: int,
    align: ir.Align | tuple[int, int],
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 query positions (Nq,) and key positions (Nk,).

    Key j sits at position j.  Query row i sits at i + Nk - Nq under
    bottom-right alignment (the last query lines up with the last key, as in
    KV-cache decoding) and at i under top-left alignment.  A call's position
    offsets (q_offset, k_offset) in place of an alignment put query row i at
    i + q_offset and key j at j + k_offset.
    """
    if isinstance(align, tuple):
        q_offset, k_offset = align
    else:
        q_offset, k_offset = {ir.Align.BOTTOM_RIGHT: nk - nq, ir.Align.TOP_LEFT: 0}[align], 0
    q_pos = torch.arange(nq, dtype=torch.int64, device=device) + q_offset
    k_pos = torch.arange(nk, dtype=torch.int64, device=device) + k_offset
    return q_pos, k_pos


# --------------------------------------------------------------------------- #
# Expression evaluator
# --------------------------------------------------------------------------- #
#
# A value's kind is read off its tensor dtype: int64 = integer, bool = boolean,
# floating = real (always `scope.real`).  Integers turn real only where the
# language says so: `/`, the real functions, and mixing with a real operand.


@dataclass(frozen=True)
class _Scope:
    q: torch.Tensor  # (Nq, 1) int64 query positions
    k: torch.Tensor  # (1, Nk) int64 key positions
    h: torch.Tensor  # (H, 1, 1) int64 query head index
    H: torch.Tensor  # () int64 number of query heads
    s: torch.Tensor | None  # scaled score (B, H, Nq, Nk); None inside masks
    real: torch.dtype  # dtype of every real value
    b: torch.Tensor | None = None  # (B, 1, 1, 1) int64 batch index
    inputs: Mapping[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    # (input, dimension, size, index, where it is outside) of each read out of range
    out_of_range: list = dataclasses.field(default_factory=list)


def _is_int(x: torch.Tensor) -> bool:
    return x.dtype == torch.int64


def _is_bool(x: torch.Tensor) -> bool:
    return x.dtype == torch.bool


def _numeric(x: torch.Tensor, what: str) -> torch.Tensor:
    if _is_bool(x):
        raise ValueError(f"{what} needs a number, got a boolean")
    return x


def _boolean(x: torch.Tensor, what: str) -> torch.Tensor:
    if not _is_bool(x):
        raise ValueError(f"{what} needs a boolean, got a number")
    return x


def _to_real(x: torch.Tensor, scope: _Scope) -> torch.Tensor:
    return _numeric(x, "a real operation").to(scope.real)


def _unify(
    a: torch.Tensor, b: torch.Tensor, scope: _Scope, what: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both ints stay ints; otherwise both become reals of the scope's dtype."""
    _numeric(a, what)
    _numeric(b, what)
    if _is_int(a) and _is_int(b):
        return a, b
    return _to_real(a, scope), _to_real(b, scope)


def _floordiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="floor")


# Operators that keep an integer result for integer operands.
_ARITHMETIC: dict[ir.BinOp, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    ir.BinOp.ADD: torch.add,
    ir.BinOp.SUB: torch.sub,
    ir.BinOp.MUL: torch.mul,
    ir.BinOp.FLOORDIV: _floordiv,
    ir.BinOp.MOD: torch.remainder,  # floor modulo: sign of the divisor
}
_COMPARISONS: dict[ir.BinOp, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    ir.BinOp.EQ: torch.eq,
    ir.BinOp.NE: torch.ne,
    ir.BinOp.LT: torch.lt,
    ir.BinOp.LE: torch.le,
    ir.BinOp.GT: torch.gt,
    ir.BinOp.GE: torch.ge,
}
_LOGICAL: dict[ir.BinOp, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    ir.BinOp.AND: torch.logical_and,
    ir.BinOp.OR: torch.logical_or,
}
_REAL_FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
}
_POLY_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "abs": torch.abs,
    "min": torch.minimum,
    "max": torch.maximum,
}


def _alibi(scope: _Scope) -> torch.Tensor:
    slopes = alibi_slopes(int(scope.H)).to(device=scope.h.device)[scope.h]
    return -slopes.to(scope.real) * (scope.q - scope.k).abs().to(scope.real)


def _score_variable(scope: _Scope) -> torch.Tensor:
    if scope.s is None:
        raise ValueError("`s` is only defined in a score expression")
    return scope.s


_NAMES: dict[str, Callable[[_Scope], torch.Tensor]] = {
    "q": lambda sc: sc.q,
    "k": lambda sc: sc.k,
    "h": lambda sc: sc.h,
    "H": lambda sc: sc.H,
    ir.SCORE_VARIABLE: _score_variable,
    ir.ALIBI: _alibi,
    "full": lambda sc: torch.ones((), dtype=torch.bool, device=sc.q.device),
    "b": lambda sc: _batch_index(sc),
    "causal": lambda sc: sc.k <= sc.q,
}


def _batch_index(sc: _Scope) -> torch.Tensor:
    if sc.b is None:
        raise ValueError("`b` needs the batch size: pass batch= (or the inputs' tensors)")
    return sc.b


def _window(sc: _Scope, left: torch.Tensor, right: torch.Tensor | None = None):
    # window(L) = window(L, 0): the L keys before the query and the query itself.
    right = torch.zeros((), dtype=torch.int64, device=sc.q.device) if right is None else right
    return (sc.q - left <= sc.k) & (sc.k <= sc.q + right)


def _prefix(sc: _Scope, length: torch.Tensor) -> torch.Tensor:
    return sc.k < length


def _chunk(sc: _Scope, size: torch.Tensor) -> torch.Tensor:
    return _floordiv(sc.q, size) == _floordiv(sc.k, size)


_MASK_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "window": _window,
    "prefix": _prefix,
    "chunk": _chunk,
}


def _check_arity(fn: str, args: tuple, lo: int, hi: int) -> None:
    if not lo <= len(args) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise ValueError(f"`{fn}` takes {want} arguments, got {len(args)}")


def _call(node: ir.Call, scope: _Scope) -> torch.Tensor:
    fn = node.fn
    args = [_evaluate(a, scope) for a in node.args]
    if fn in _MASK_FUNCTIONS:
        _check_arity(fn, node.args, *ir.MASK_FUNCTIONS[fn])
        return _MASK_FUNCTIONS[fn](scope, *(_numeric(a, fn) for a in args))
    if fn in _REAL_FUNCTIONS:
        _check_arity(fn, node.args, 1, 1)
        return _REAL_FUNCTIONS[fn](_to_real(args[0], scope))
    if fn in _POLY_FUNCTIONS:
        arity = ir.POLY_FUNCTIONS[fn]
        _check_arity(fn, node.args, arity, arity)
        if arity == 2:
            args = list(_unify(args[0], args[1], scope, fn))
        return _POLY_FUNCTIONS[fn](*(_numeric(a, fn) for a in args))
    if fn == ir.SOFTCAP:
        _check_arity(fn, node.args, 2, 2)
        x, cap = (_to_real(a, scope) for a in args)
        return cap * torch.tanh(x / cap)
    raise ValueError(f"unknown function `{fn}`")


def _binary(node: ir.Binary, scope: _Scope) -> torch.Tensor:
    left = _evaluate(node.left, scope)
    read_before = len(scope.out_of_range)
    right = _evaluate(node.right, scope)
    op = node.op
    if op in _LOGICAL:
        # `a & b` reads b only where a holds, `a | b` only where a fails: an
        # index of b out of range elsewhere does not count.
        needed = _boolean(left, op.value) if op is ir.BinOp.AND else ~_boolean(left, op.value)
        scope.out_of_range[read_before:] = [
            (name, dim, size, index, outside & needed)
            for name, dim, size, index, outside in scope.out_of_range[read_before:]
        ]
        return _LOGICAL[op](_boolean(left, op.value), _boolean(right, op.value))
    if op in _COMPARISONS:
        return _COMPARISONS[op](*_unify(left, right, scope, op.value))
    if op in _ARITHMETIC:
        return _ARITHMETIC[op](*_unify(left, right, scope, op.value))
    if op is ir.BinOp.DIV:  # true division: always real
        return _to_real(left, scope) / _to_real(right, scope)
    raise ValueError(f"unknown binary operator {op!r}")


def _unary(node: ir.Unary, scope: _Scope) -> torch.Tensor:
    operand = _evaluate(node.operand, scope)
    if node.op is ir.UnaryOp.NEG:
        return -_numeric(operand, "unary -")
    if node.op is ir.UnaryOp.NOT:
        return torch.logical_not(_boolean(operand, "!"))
    raise ValueError(f"unknown unary operator {node.op!r}")


def _num(node: ir.Num, scope: _Scope) -> torch.Tensor:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"bad literal {value!r}")
    dtype = torch.int64 if isinstance(value, int) else scope.real
    return torch.tensor(value, dtype=dtype, device=scope.q.device)


def _name(node: ir.Name, scope: _Scope) -> torch.Tensor:
    if node.id not in _NAMES:
        raise ValueError(f"unknown name `{node.id}`")
    return _NAMES[node.id](scope)


def _index(node: ir.Index, scope: _Scope) -> torch.Tensor:
    """The input's elements at the (broadcast) indices.  An index outside its
    dimension reads the nearest element instead and is recorded in
    `scope.out_of_range`: the caller decides whether that pair counts (a
    score's index needs to be in range only where the mask keeps the pair)."""
    if node.input not in scope.inputs:
        raise ValueError(f"input `{node.input}` was not given")
    tensor = scope.inputs[node.input]
    if len(node.args) != tensor.dim():
        raise ValueError(
            f"`{node.input}` has {tensor.dim()} dimensions, indexed with {len(node.args)}"
        )
    args = [_evaluate(a, scope) for a in node.args]
    for a in args:
        if not _is_int(a):
            raise ValueError(f"an index of `{node.input}` must be an integer")
    args = list(torch.broadcast_tensors(*args)) if args else []
    for dim, (a, size) in enumerate(zip(args, tensor.shape)):
        outside = (a < 0) | (a >= size)
        if bool(outside.any()):
            scope.out_of_range.append((node.input, dim, size, a, outside))
            args[dim] = a.clamp(0, max(size - 1, 0))
    if 0 in tensor.shape:  # a dimension of no element (a sequence without keys): no value
        value = torch.zeros(args[0].shape, dtype=tensor.dtype, device=tensor.device)
    else:
        value = tensor[tuple(args)] if args else tensor
    if value.dtype in (torch.int32, torch.int64):
        return value.to(torch.int64)
    return value.to(scope.real)


def _raise_out_of_range(scope: _Scope, where: torch.Tensor | None = None) -> None:
    """ValueError for the first index out of range (at a pair where `where`
    holds, when given)."""
    for name, dim, size, index, outside in scope.out_of_range:
        if where is not None:
            outside = outside & where
        if bool(outside.any()):
            index, outside = torch.broadcast_tensors(index, outside)
            bad = int(index[outside][0])
            raise ValueError(
                f"index {bad} of `{name}` is out of range for its dimension {dim} of size {size}"
            )


_NODES: dict[type, Callable[[object, _Scope], torch.Tensor]] = {
    ir.Num: _num,
    ir.Name: _name,
    ir.Call: _call,
    ir.Unary: _unary,
    ir.Binary: _binary,
    ir.Index: _index,
}


def _evaluate(node: ir.Expr, scope: _Scope) -> torch.Tensor:
    handler = _NODES.get(type(node))
    if handler is None:
        raise ValueError(f"not an expression node: {node!r}")
    return handler(node, scope)


Rows = torch.Tensor | list[int] | tuple[int, ...] | range | None


def _row_index(rows: Rows, nq: int, device: torch.device | str | None) -> torch.Tensor | None:
    """`rows` as an int64 index tensor (None: every row), checked against Nq."""
    if rows is None:
        return None
    if isinstance(rows, torch.Tensor):
        index = rows
    elif all(isinstance(r, int) and not isinstance(r, bool) for r in rows):
        index = torch.tensor(list(rows), dtype=torch.int64)
    else:
        raise ValueError("rows must be a 1-D sequence of integer query row indices")
    if index.dim() != 1 or index.dtype not in (torch.int64, torch.int32):
        raise ValueError("rows must be a 1-D sequence of integer query row indices")
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= nq):
        raise ValueError(f"rows must lie in 0..{nq - 1} (Nq = {nq})")
    return index.to(device=device, dtype=torch.int64)


def _scope(
    nq: int,
    nk: int,
    num_heads: int,
    align: ir.Align,
    *,
    s: torch.Tensor | None,
    real: torch.dtype,
    device: torch.device | str | None,
    rows: torch.Tensor | None = None,
    batch: int | None = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> _Scope:
    q_pos, k_pos = positions(nq, nk, align, device=device)
    if rows is not None:
        q_pos = q_pos[rows]
    b = None
    if batch is not None:
        b = torch.arange(batch, dtype=torch.int64, device=device)[:, None, None, None]
    return _Scope(
        q=q_pos[:, None],
        k=k_pos[None, :],
        h=torch.arange(num_heads, dtype=torch.int64, device=device)[:, None, None],
        H=torch.tensor(num_heads, dtype=torch.int64, device=device),
        s=s,
        real=real,
        b=b,
        inputs={} if inputs is None else dict(inputs),
    )


# --------------------------------------------------------------------------- #
# Mask, scores, attention
# --------------------------------------------------------------------------- #


def mask_matrix(
    variant: ir.Variant,
    nq: int,
    nk: int,
    num_heads: int,
    device: torch.device | str | None = None,
    *,
    rows: Rows = None,
    batch: int | None = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
    offsets: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Boolean (num_heads, Nq, Nk): True where query i may see key j
    ((num_heads, len(rows), Nk) for the given `rows`).  A mask that reads the
    batch index or an input differs per batch: (batch, num_heads, Nq, Nk),
    for the `batch` and `inputs` given.  `offsets`: a call's (q_offset,
    k_offset) in place of the variant's alignment (`positions`).

    Real sub-expressions of a mask are evaluated in float64 whatever the
    variant's dtype: the mask is exact by definition.
    """
    index = _row_index(rows, nq, device)
    if inputs is not None and batch is not None:
        sizes = {"B": batch, "H": num_heads, "Hkv": _kv_heads(variant, inputs, num_heads)}
        problem = index_ranges.out_of_range(variant, {**sizes, "Nq": nq, "Nk": nk}, offsets)
        if problem is not None:
            raise ValueError(problem)
    scope = _scope(
        nq, nk, num_heads, offsets or variant.align, s=None, real=torch.float64, device=device,
        rows=index, batch=batch, inputs=inputs,
    )  # fmt: skip
    visible = _evaluate(variant.mask, scope)
    if not _is_bool(visible):
        raise ValueError("the mask expression must be boolean")
    _raise_out_of_range(scope)  # the mask's indices must be in range at every pair
    n_rows = nq if index is None else index.numel()
    if ir.reads_runtime_data(variant.mask):
        if batch is None:
            raise ValueError("a mask that reads `b` or an input differs per batch: pass batch=")
        return visible.expand(batch, num_heads, n_rows, nk).clone()
    return visible.expand(num_heads, n_rows, nk).clone()


def _kv_heads(variant: ir.Variant, inputs: Mapping[str, torch.Tensor], default: int) -> int:
    """Hkv as the inputs' shapes give it (a mask alone does not know k)."""
    for decl in variant.inputs:
        if "Hkv" in decl.shape and decl.name in inputs:
            return inputs[decl.name].shape[decl.shape.index("Hkv")]
    return default


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None) -> None:
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError("q and k must be 4-D (B, H, N, D)")
    batch, heads, _, dim = q.shape
    kv_batch, kv_heads, nk, kv_dim = k.shape
    if kv_batch != batch or kv_dim != dim:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} disagree")
    if kv_heads < 1 or heads % kv_heads != 0:
        raise ValueError(f"{kv_heads} kv heads do not divide {heads} query heads")
    if v is not None and (v.dim() != 4 or v.shape[:3] != k.shape[:3]):
        raise ValueError(
            f"v {tuple(v.shape)} must have k's (B, Hkv, Nk) {tuple(k.shape[:3])}, "
            "and its own last dimension (v_head_dim)"
        )


def _expand_kv(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    # GQA/MQA: query head h reads kv head h // (H // Hkv).
    return x.repeat_interleave(num_heads // x.shape[1], dim=1)


def _scores(
    variant: ir.Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float | None,
    dtype: torch.dtype,
    rows: torch.Tensor | None = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
    visible: torch.Tensor | None = None,
    offsets: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Scores of the query rows `rows` (every row for None)."""
    if q.shape[-1] != variant.head_dim:
        raise ValueError(
            f"head dim {q.shape[-1]} of the inputs differs from the variant's "
            f"head_dim = {variant.head_dim}"
        )
    if scale is None:
        scale = variant.scale
    if scale is None:
        scale = 1.0 / math.sqrt(variant.head_dim)
    _, num_heads, nq, _ = q.shape
    nk = k.shape[2]
    k = _expand_kv(k.to(dtype), num_heads)
    if rows is not None:
        q = q[:, :, rows]
    s = (q.to(dtype) @ k.transpose(-2, -1)) * scale
    return _score_of(variant, s, nq, nk, rows, inputs, visible, offsets)


def _score_of(
    variant: ir.Variant,
    s: torch.Tensor,
    nq: int,
    nk: int,
    rows: torch.Tensor | None,
    inputs: Mapping[str, torch.Tensor] | None = None,
    visible: torch.Tensor | None = None,
    offsets: tuple[int, int] | None = None,
) -> torch.Tensor:
    """The score expression applied to the products `s` (B, H, rows, Nk).
    With `visible`, an index out of range at a visible pair is a ValueError;
    elsewhere (and without it) such a pair's score is undefined.  With
    `visible`, masked pairs take `s` detached: their score may be infinite
    or NaN with an infinite derivative (`s / alibi` on the diagonal), and the
    zero gradient they get from the mask would turn NaN on the way back."""
    if visible is not None:
        s = torch.where(visible, s, s.detach())
    scope = _scope(
        nq, nk, s.shape[1], offsets or variant.align, s=s, real=s.dtype, device=s.device,
        rows=rows, batch=s.shape[0], inputs=inputs,
    )  # fmt: skip
    scored = _evaluate(variant.score, scope)
    if _is_bool(scored):
        raise ValueError("the score expression must be a number")
    if visible is not None:
        _raise_out_of_range(scope, visible)
    return torch.broadcast_to(scored.to(s.dtype), s.shape)


def scores(
    variant: ir.Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float | None = None,
    *,
    rows: Rows = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """float64 (B, H, Nq, Nk): the score expression applied to s = q k^T * scale
    ((B, H, len(rows), Nk) for the given `rows`).

    `scale` defaults to the variant's, else 1/sqrt(head_dim).  The mask is not
    applied.  `inputs`: the variant's declared inputs by name.
    """
    _check_shapes(q, k, None)
    inputs = check_inputs(variant, q, k, inputs)
    index = _row_index(rows, q.shape[2], q.device)
    return _scores(variant, q, k, scale, torch.float64, index, inputs)


def score_slope(
    variant: ir.Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float | None = None,
    *,
    rows: Rows = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 (s, d score / d s), both (B, H, Nq, Nk) (or len(rows) query
    rows): the products s = q k^T * scale and the score expression's
    derivative at them, pair by pair.  The mask is not applied."""
    s, slope, _ = _score_derivatives(variant, q, k, scale, rows, inputs, second=False)
    return s, slope


def score_curvature(
    variant: ir.Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float | None = None,
    *,
    rows: Rows = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 (s, d score / d s, d^2 score / d s^2) pair by pair, as
    `score_slope`; where the slope is infinite (sqrt at 0) the second
    derivative is not finite either."""
    return _score_derivatives(variant, q, k, scale, rows, inputs, second=True)


def _score_derivatives(variant, q, k, scale, rows, inputs, *, second: bool):
    _check_shapes(q, k, None)
    index = _row_index(rows, q.shape[2], q.device)
    products = scores(
        dataclasses.replace(variant, score=ir.Name(ir.SCORE_VARIABLE)), q, k, scale, rows=rows,
        inputs=inputs,
    )  # fmt: skip
    zeros = torch.zeros_like(products)
    s = products.detach().requires_grad_()
    with torch.enable_grad():
        inputs = {n: x.detach() for n, x in check_inputs(variant, q, k, inputs).items()}
        scored = _score_of(variant, s, q.shape[2], k.shape[2], index, inputs)
        if not scored.requires_grad:  # a score without `s`
            return products, zeros, zeros
        (slope,) = torch.autograd.grad(scored.sum(), s, allow_unused=True, create_graph=second)
        if slope is None:
            return products, zeros, zeros
        if not (second and slope.requires_grad):  # linear in s
            return products, slope.detach(), zeros
        (curvature,) = torch.autograd.grad(slope.sum(), s, allow_unused=True)
    return products, slope.detach(), zeros if curvature is None else curvature


def read_sums(
    variant: ir.Variant,
    read: ir.Index,
    value: ir.Expr,
    s: torch.Tensor,
    weight: torch.Tensor,
    n_queries: int,
    *,
    rows: Rows = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """float64, of the shape of `read`'s input: for each element, the sum of
    weight * |value| over the pairs that read it, `value` an expression of
    the pair (a derivative of the score) at the products `s`.  `s` and
    `weight` are (B, H, Nq, Nk), or (B, H, len(rows), Nk) for the query rows
    `rows` of a call with `n_queries` queries."""
    batch, heads, _, nk = s.shape
    inputs = {n: x.detach() for n, x in (inputs or {}).items()}
    scope = _scope(
        n_queries, nk, heads, variant.align, s=s.double(), real=torch.float64, device=s.device,
        rows=_row_index(rows, n_queries, s.device), batch=batch, inputs=inputs,
    )  # fmt: skip
    shape = tuple(inputs[read.input].shape)
    terms = torch.broadcast_to(_evaluate(value, scope).double().abs(), s.shape) * weight
    flat = torch.zeros(s.shape, dtype=torch.int64, device=s.device)
    inside = torch.ones(s.shape, dtype=torch.bool, device=s.device)
    for arg, size in zip(read.args, shape):
        i = torch.broadcast_to(_evaluate(arg, scope), s.shape)
        inside &= (i >= 0) & (i < size)
        flat = flat * size + i.clamp(0, size - 1)
    sums = torch.zeros(math.prod(shape), dtype=torch.float64, device=s.device)
    sums.index_add_(0, flat[inside], terms[inside].nan_to_num(0.0, posinf=0.0))
    return sums.view(shape)


def input_dtype(i: ir.Input) -> torch.dtype:
    """The torch dtype of input `i`'s elements."""
    return getattr(torch, i.element.torch_name.removeprefix("torch."))


def input_shape(i: ir.Input, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """Input `i`'s shape for a call's sizes (`B`, `H`, `Hkv`, `Nq`, `Nk`)."""
    return tuple(sizes[d] if isinstance(d, str) else d for d in i.shape)


def check_inputs(
    variant: ir.Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    inputs: Mapping[str, torch.Tensor] | None,
    offsets: tuple[int, int] | None = None,
) -> dict[str, torch.Tensor]:
    """The variant's inputs from `inputs`, each checked against its
    declaration (shape from q (B, H, Nq, D) and k (B, Hkv, Nk, D), element
    type, device): a missing, unknown or mis-shaped input is a ValueError (a
    wrong type a TypeError) naming it, and so is an index that may leave its
    dimension at these sizes and position `offsets` (`flashgen.index_ranges`,
    the language's rule)."""
    given = dict(inputs or {})
    declared = {i.name: i for i in variant.inputs}
    for name in given:
        if name not in declared:
            raise ValueError(f"unknown input `{name}`; the variant declares {sorted(declared)}")
    sizes = {
        "B": q.shape[0],
        "H": q.shape[1],
        "Hkv": k.shape[1],
        "Nq": q.shape[2],
        "Nk": k.shape[2],
    }
    for name, decl in declared.items():
        if name not in given:
            raise ValueError(f"missing input `{name}` ({decl.element.value}{list(decl.shape)})")
        x = given[name]
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"input `{name}` must be a torch.Tensor, got {type(x).__name__}")
        shape = input_shape(decl, sizes)
        if tuple(x.shape) != shape:
            raise ValueError(f"input `{name}` must have shape {shape}, got {tuple(x.shape)}")
        if x.dtype != input_dtype(decl):
            raise TypeError(f"input `{name}` must be {input_dtype(decl)}, got {x.dtype}")
        if x.device != q.device:
            raise ValueError(f"input `{name}` is on {x.device}, but q is on {q.device}")
    problem = index_ranges.out_of_range(variant, sizes, offsets)
    if problem is not None:
        raise ValueError(problem)
    return given


def attention_ref(
    variant: ir.Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
    rows: Rows = None,
    inputs: Mapping[str, torch.Tensor] | None = None,
    sinks: torch.Tensor | None = None,
    offsets: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense attention of `variant`, every operation in `dtype`.

    q, k: (B, H, Nq, D), (B, Hkv, Nk, D) with D = head_dim; v: (B, Hkv,
    Nk, Dv) with Dv = `variant.v_dim` (v_head_dim: DeepSeek's MLA).
    Returns o (B, H, Nq, Dv) in `dtype` and lse (B, H, Nq), the natural-log
    log-sum-exp of the scores over visible keys, in `dtype` (float32 when
    `dtype` is 16-bit).  A fully masked row (every row when Nk = 0) gets
    o = 0 and lse = -inf, and zero gradients; no NaN appears forward or
    backward.  With `rows`, o is (B, H, len(rows), D) and lse (B, H,
    len(rows)): those query rows only, at their positions in the full
    problem; gradients still flow to the whole q (zero on other rows).
    `inputs`: the variant's declared inputs by name (`check_inputs`); real
    ones are read in `dtype`, and a learnable one that requires grad gets its
    gradient through autograd.  `sinks` (H,): gpt-oss's attention sinks, one
    more logit per head in every row's softmax, with a zero value (a key
    column that every row sees); the lse includes it.  `offsets`: a call's
    (q_offset, k_offset) in place of the variant's alignment (`positions`).
    """
    _check_shapes(q, k, v)
    if v.shape[3] != variant.v_dim:
        raise ValueError(f"v's last dimension {v.shape[3]} is not v_head_dim = {variant.v_dim}")
    inputs = check_inputs(variant, q, k, inputs, offsets)
    batch, num_heads, nq, _ = q.shape
    nk = k.shape[2]
    index = _row_index(rows, nq, q.device)
    visible = mask_matrix(
        variant, nq, nk, num_heads, device=q.device, rows=index, batch=batch, inputs=inputs,
        offsets=offsets,
    )  # fmt: skip
    s = _scores(variant, q, k, scale, dtype, index, inputs, visible, offsets)
    v = _expand_kv(v.to(dtype), num_heads)
    if sinks is not None:
        if tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks must have shape ({num_heads},), got {tuple(sinks.shape)}")
        column = sinks.to(dtype).view(1, num_heads, 1, 1).expand(*s.shape[:-1], 1)
        s = torch.cat([s, column], dim=-1)
        visible = torch.cat(
            [visible.expand(*column.shape[:-1], nk), torch.ones_like(column, dtype=torch.bool)], -1
        )
        v = torch.cat([v, v.new_zeros(v.shape[0], num_heads, 1, v.shape[-1])], 2)
        nk += 1
    any_visible = visible.any(dim=-1, keepdim=True)

    # Safe softmax.  The row max is only a shift (the result does not depend
    # on it), so it is detached; an all-masked row uses 0 instead of -inf so
    # that s - m never forms -inf - (-inf) = NaN.  Masked entries are zeroed
    # through `where`, whose backward sends them no gradient.
    neg_inf = torch.tensor(float("-inf"), dtype=dtype, device=q.device)
    s = torch.where(visible, s, neg_inf)
    if nk == 0:  # s[..., :1] would keep the empty key axis: build the (.., 1) column
        row_max = s.new_zeros(s.shape[:-1] + (1,))
    else:
        row_max = s.detach().amax(dim=-1, keepdim=True)
        row_max = torch.where(any_visible, row_max, torch.zeros_like(row_max))
    p = torch.where(visible, torch.exp(s - row_max), torch.zeros_like(s))
    row_sum = p.sum(dim=-1, keepdim=True)
    safe_sum = torch.where(row_sum > 0, row_sum, torch.ones_like(row_sum))
    o = (p / safe_sum) @ v

    lse_dtype = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    lse = row_max.to(lse_dtype) + torch.log(safe_sum.to(lse_dtype))
    lse = torch.where(row_sum > 0, lse, torch.full_like(lse, float("-inf")))
    return o, lse.squeeze(-1)
