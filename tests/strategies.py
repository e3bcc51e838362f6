"""The tests' Hypothesis strategies for checked IR: flashgen/strategies.py.

They live in the package so that `flashgen bench --random` draws specs from
the same language as the tests; the tests import them from here, as before.
"""

from flashgen.strategies import block_names, int_exprs, masks, scores, variants

__all__ = ["block_names", "int_exprs", "masks", "scores", "variants"]
