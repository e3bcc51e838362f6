"""Parsing: `.attn` source text in, an `ir.SpecFile` syntax tree and Diagnostics out.

`parse(text, path)` never raises on bad input.  It returns `(spec, [])` when
the text is syntactically valid, and `(None, diagnostics)` otherwise, so that
`check` never sees a tree with holes in it (which would only add follow-on
errors such as a "missing" setting whose line failed to parse).

The grammar lives in `grammars/attn.lark` (shipped as `flashgen.grammars`).
Lark's LALR(1) parser is driven token by token through its interactive API so
that one syntax error does not end the parse: after an error inside a block
the rest of the statement is skipped up to the next newline, `;` or `}`, and
parsing resumes from the state saved at the start of that statement; at the
top level it resumes at the next `attention`.  That reports the first error of
every broken statement.  Messages describe what was found and what was
expected in words, never in Lark's terminal names.

Nothing here recurses over the input: tokens are checked against the LALR
table by replaying its reductions on the state stack (no copy of the parser
per token), the parse tree becomes ir through lark's non-recursive
transformer, and an expression nested deeper than `ir.MAX_EXPR_DEPTH` or
larger than `ir.MAX_EXPR_NODES` nodes is diagnosed where it crosses the
limit and its setting dropped, so later stages, which do recurse, only ever
see bounded trees.

This is the only module that imports lark; it builds ir nodes and nothing
else, so no text of a spec is ever evaluated.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from collections.abc import Iterator
from pathlib import Path

from lark import Lark, Token, Transformer_NonRecursive, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedToken
from lark.parsers.lalr_analysis import Shift
from lark.parsers.lalr_interactive_parser import InteractiveParser

from flashgen import ir
from flashgen.diagnostics import Diagnostic, expression_too_deep, expression_too_large

__all__ = ["parse"]


def parse(text: str, path: str = "<string>") -> tuple[ir.SpecFile | None, list[Diagnostic]]:
    """Parse one `.attn` file.  See the module docstring for the contract."""
    parser = _Recovering(text, path)
    tree = parser.run()
    diagnostics = parser.diagnostics
    if tree is None and not diagnostics:  # recovery gave up; never silently
        diagnostics.append(Diagnostic(path, ir.Span(1, 1, 1, 1), "cannot parse this file"))
    if tree is not None:
        # Also after syntax errors: the statements that parsed are all there.
        oversized = _drop_oversized_settings(tree, path)
        if oversized:
            diagnostics = sorted(diagnostics + oversized, key=lambda d: d.span.line)
    if diagnostics:
        return None, diagnostics
    builder = _ToIR(path)
    blocks = builder.transform(tree)
    diagnostics += builder.diagnostics
    if diagnostics:
        return None, sorted(diagnostics, key=lambda d: (d.span.line, d.span.column))
    return ir.SpecFile(blocks=blocks, path=path), []


# --------------------------------------------------------------------------- #
# Grammar
# --------------------------------------------------------------------------- #


def _grammar_text() -> str:
    try:
        resource = importlib.resources.files("flashgen.grammars") / "attn.lark"
    except ModuleNotFoundError:
        # Running from a checkout that is not installed: the grammar sits at the
        # repository root, mapped into the package only by the build.
        resource = Path(__file__).parent.parent / "grammars" / "attn.lark"
    return resource.read_text(encoding="utf-8")


@functools.cache
def _lark() -> Lark:
    return Lark(
        _grammar_text(),
        parser="lalr",
        lexer="basic",
        start="spec_file",
        propagate_positions=True,
        maybe_placeholders=False,
    )


# --------------------------------------------------------------------------- #
# Expression size limits
# --------------------------------------------------------------------------- #

# Rules (and aliases) that become an ir node of their own; `paren` leaves none
# but is a level of nesting.
_NODE_RULES = frozenset({"binary", "unary", "call", "index", "name", "int", "real"})
_NESTING_RULES = frozenset({"binary", "unary", "call", "index", "paren"})


def _drop_oversized_settings(tree: Tree, path: str) -> list[Diagnostic]:
    """Diagnose every setting whose expression is too deep or too large and
    remove it from the tree, so that nothing builds or walks it."""
    diagnostics = []
    for block in tree.children:
        if not isinstance(block, Tree):
            continue
        kept = []
        for child in block.children:
            problem = _size_problem(child.children[1]) if _is_setting(child) else None
            if problem is None:
                kept.append(child)
            else:
                span, message, note = problem
                diagnostics.append(Diagnostic(path, span, message, note=note))
        block.children = kept
    return diagnostics


def _is_setting(node) -> bool:
    return isinstance(node, Tree) and node.data == "setting"


def _size_problem(expr) -> tuple[ir.Span, str, str] | None:
    """(where, message, note) for the first place, in source order, where the
    expression crosses the depth or the node limit; None if it stays within."""
    nodes = 0
    stack = [(expr, 0)]  # (subtree, levels of nesting above it)
    while stack:
        node, level = stack.pop()
        if not isinstance(node, Tree):
            continue
        if node.data in _NESTING_RULES:
            level += 1
            if level > ir.MAX_EXPR_DEPTH:
                return (_nesting_span(node), *expression_too_deep())
        if node.data in _NODE_RULES:
            nodes += 1
            if nodes > ir.MAX_EXPR_NODES:
                return (_nesting_span(node), *expression_too_large())
        stack.extend((child, level) for child in reversed(node.children))
    return None


def _nesting_span(node: Tree) -> ir.Span:
    """The token that opens a level: an operator, a function name, a '('
    (not the whole subtree, which may run over most of a long line)."""
    if node.data == "binary":
        return _span(node.children[1])
    if node.data in ("unary", "call", "index"):
        return _span(node.children[0])
    if node.data == "paren":
        line, column = node.meta.line, node.meta.column
        return ir.Span(line, column, line, column + 1)
    return _span(node.meta)


# --------------------------------------------------------------------------- #
# Tree -> ir
# --------------------------------------------------------------------------- #

_BINARY_OPS = {
    "OR": ir.BinOp.OR,
    "AND": ir.BinOp.AND,
    "EQ": ir.BinOp.EQ,
    "NE": ir.BinOp.NE,
    "LT": ir.BinOp.LT,
    "LE": ir.BinOp.LE,
    "GT": ir.BinOp.GT,
    "GE": ir.BinOp.GE,
    "PLUS": ir.BinOp.ADD,
    "MINUS": ir.BinOp.SUB,
    "STAR": ir.BinOp.MUL,
    "SLASH": ir.BinOp.DIV,
    "DIV": ir.BinOp.FLOORDIV,
    "PERCENT": ir.BinOp.MOD,
}
_UNARY_OPS = {"MINUS": ir.UnaryOp.NEG, "NOT": ir.UnaryOp.NOT}

# Python refuses to convert longer digit strings to int; such a literal is far
# outside int32 anyway.
_MAX_INT_DIGITS = 4000


def _span(node) -> ir.Span:
    """Span of a Lark Token or of a tree's `meta`."""
    return ir.Span(node.line, node.column, node.end_line, node.end_column)


@v_args(meta=True, inline=True)
class _ToIR(Transformer_NonRecursive):
    """One method per grammar rule (or alias), each building the ir node of that name."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.diagnostics: list[Diagnostic] = []

    def spec_file(self, meta, *blocks: ir.Block) -> tuple[ir.Block, ...]:
        return blocks

    def block(self, meta, keyword: Token, name: Token, *statements) -> ir.Block:
        return ir.Block(
            name=str(name),
            settings=tuple(x for x in statements if isinstance(x, ir.Setting)),
            span=_span(meta),
            name_span=_span(name),
            inputs=tuple(x for x in statements if isinstance(x, ir.InputDecl)),
        )

    def setting(self, meta, key: Token, value: ir.Expr) -> ir.Setting:
        return ir.Setting(key=str(key), value=value, span=_span(meta), key_span=_span(key))

    def input(self, meta, name: Token, *rest) -> ir.InputDecl:
        learnable = bool(rest) and isinstance(rest[0], Token) and rest[0].type == "LEARNABLE"
        element, *sizes = rest[1:] if learnable else rest
        return ir.InputDecl(
            name=str(name),
            element=str(element),
            shape=tuple(value for value, _ in sizes),
            learnable=learnable,
            span=_span(meta),
            name_span=_span(name),
            element_span=_span(element),
            size_spans=tuple(span for _, span in sizes),
        )

    def size_name(self, meta, token: Token) -> tuple[str, ir.Span]:
        return str(token), _span(token)

    def size_int(self, meta, token: Token) -> tuple[int, ir.Span]:
        return self._integer(token), _span(token)

    def index(self, meta, name: Token, *args: ir.Expr) -> ir.Index:
        return ir.Index(str(name), args, span=_span(meta))

    def binary(self, meta, left: ir.Expr, op: Token, right: ir.Expr) -> ir.Binary:
        return ir.Binary(_BINARY_OPS[op.type], left, right, span=_span(meta))

    def unary(self, meta, op: Token, operand: ir.Expr) -> ir.Unary:
        return ir.Unary(_UNARY_OPS[op.type], operand, span=_span(meta))

    def call(self, meta, fn: Token, *args: ir.Expr) -> ir.Call:
        return ir.Call(str(fn), args, span=_span(meta))

    def name(self, meta, token: Token) -> ir.Name:
        return ir.Name(str(token), span=_span(meta))

    def int(self, meta, token: Token) -> ir.Num:
        return ir.Num(self._integer(token), span=_span(meta))

    def _integer(self, token: Token) -> int:
        """The literal's value; 0, with a diagnostic, past `_MAX_INT_DIGITS` digits."""
        digits = str(token).lstrip("0") or "0"
        if len(digits) > _MAX_INT_DIGITS:
            self.diagnostics.append(
                Diagnostic(self.path, _span(token), "integer literal is too large")
            )
            return 0
        return int(digits)

    def real(self, meta, token: Token) -> ir.Num:
        # float() of a literal this grammar accepts cannot fail; huge exponents
        # give inf, which `check` reports.
        return ir.Num(float(token), span=_span(meta))

    def paren(self, meta, inner: ir.Expr) -> ir.Expr:
        # Parentheses leave no node of their own, but the span covers them so
        # diagnostics underline `(q - k)` rather than `q - k`.
        return dataclasses.replace(inner, span=_span(meta))


# --------------------------------------------------------------------------- #
# The error-recovering driver
# --------------------------------------------------------------------------- #

# What a terminal is called in messages, when it is not a fixed string.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "LEARNABLE": "'learnable'",
    "INT": "an integer",
    "REAL": "a number",
    "_NL": "a newline",
    "$END": "the end of the file",
}
_OPERAND_START = frozenset({"INT", "REAL", "LPAR"})
_STATEMENT_END = frozenset({"_NL", "SEMICOLON", "RBRACE"})
_BINARY_OPERATOR_TERMINALS = frozenset(_BINARY_OPS)
_COMPARISON_TERMINALS = frozenset({"EQ", "NE", "LT", "LE", "GT", "GE"})

# Characters that usually mean someone wrote Python (or another language).
_CHARACTER_HINTS = {
    "'": "the language has no strings",
    '"': "the language has no strings",
    ".": "the language has no attribute access; reals are written like 0.5",
    "@": "the language has no decorators or matrix products",
    "`": "the language has no strings",
    "\\": "a statement ends at the end of its line; there is no line continuation",
}


class _GiveUp(Exception):
    """Recovery itself failed; stop with the diagnostics collected so far."""


@dataclasses.dataclass
class _BadCharacter:
    char: str
    span: ir.Span


class _Recovering:
    """Feeds tokens to the LALR parser one at a time, recovering from errors."""

    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        self.diagnostics: list[Diagnostic] = []
        self.ip: InteractiveParser = _lark().parse_interactive(text)
        self.terminals = {t.name: t for t in _lark().terminals}
        # Parser state at the start of the current statement (inside a block)
        # or of the current top-level item.
        self.checkpoint = self.ip.parser_state.copy(deepcopy_values=False)
        self.in_header = False  # between `attention` and `{`
        self.in_block = False  # between `{` and `}`
        self.block_keyword: Token | None = None
        self.block_name: Token | None = None
        self.open_parens: list[Token] = []
        self.skipping = False
        self.value: _ValueLimits | None = None  # while inside a setting's value

    # -- main loop ---------------------------------------------------------- #

    def run(self) -> Tree | None:
        """The parse tree, or None if recovery gave up (diagnostics say why)."""
        try:
            for item in self._tokens():
                if isinstance(item, _BadCharacter):
                    if not self.skipping:
                        self._bad_character(item)
                    continue
                if self.skipping:
                    if not self._resumes(item):
                        continue
                    self._restore()
                self._feed(item)
            return self._finish()
        except _GiveUp:
            return None

    def _tokens(self) -> Iterator[Token | _BadCharacter]:
        """Lark's tokens, with unlexable characters reported and stepped over."""
        lexer_thread = self.ip.lexer_thread
        line_counter = lexer_thread.state.line_ctr
        while True:
            try:
                yield from lexer_thread.lex(self.ip.parser_state)
                return
            except UnexpectedCharacters as error:
                char = self.text[error.pos_in_stream]
                yield _BadCharacter(
                    char,
                    ir.Span(error.line, error.column, error.line, error.column + 1),
                )
                # Step over the character, as Lark's own `on_error` resumption does.
                line_counter.feed(char)

    def _resumes(self, token: Token) -> bool:
        """Whether skipping after an error stops at this token."""
        if self.in_block:
            return token.type in _STATEMENT_END or token.type == "ATTENTION"
        return token.type == "ATTENTION"

    def _restore(self) -> None:
        self.ip.parser_state = self.checkpoint.copy(deepcopy_values=False)
        self.skipping = False
        self.open_parens.clear()
        self.value = None
        if not self.in_block:
            self.in_header = False

    # -- feeding ------------------------------------------------------------ #

    def _feed(self, token: Token) -> None:
        if self._acceptable(token.type):
            self.ip.feed_token(token)
            self._advanced(token)
        else:
            self._unexpected(token)

    def _acceptable(self, kind: str) -> bool:
        """Whether the parser would take a token of this kind now.

        LALR may reduce before it notices that a token is wrong, so asking
        only the current state is not enough, and copying the parser state
        to undo a failed feed costs time in proportion to the nesting: the
        reductions are replayed on the state numbers alone instead.
        """
        state = self.ip.parser_state
        states, stack = state.parse_conf.states, state.state_stack
        below = len(stack)  # stack[:below] is untouched by the replay
        pushed: list = []  # states the replayed reductions put above it
        while True:
            action = states[pushed[-1] if pushed else stack[below - 1]].get(kind)
            if action is None:
                return False
            what, arg = action
            if what is Shift:
                return True
            size = len(arg.expansion)
            popped = min(size, len(pushed))
            del pushed[len(pushed) - popped :]
            below -= size - popped
            top = pushed[-1] if pushed else stack[below - 1]
            pushed.append(states[top][arg.origin.name][1])
            if kind == "$END" and pushed[-1] == state.parse_conf.end_state:
                return True

    def _accepts(self) -> set[str]:
        """The terminals the parser would take now (lark's own `accepts`
        deep-copies the parser, values included, for every terminal)."""
        choices = self.ip.parser_state.parse_conf.states[self.ip.parser_state.position]
        return {kind for kind in choices if kind.isupper() and self._acceptable(kind)}

    def _feed_or_give_up(self, token: Token) -> None:
        """Feed a token that recovery has made acceptable."""
        try:
            self.ip.feed_token(token)
        except UnexpectedToken:
            raise _GiveUp from None
        self._advanced(token)

    def _advanced(self, token: Token) -> None:
        """Track where we are after the parser accepted `token`."""
        kind = token.type
        if kind == "ATTENTION":
            self.in_header = True
            self.block_keyword = token
            self.block_name = None
        elif kind == "NAME" and self.in_header:
            self.block_name = token
        elif kind == "LBRACE":
            self.in_header = False
            self.in_block = True
        elif kind == "RBRACE":
            self.in_block = False
        elif kind in ("LPAR", "LSQB"):
            self.open_parens.append(token)
        elif kind in ("RPAR", "RSQB") and self.open_parens:
            self.open_parens.pop()
        if kind == "EQUAL" and self.in_block:
            self.value = _ValueLimits()
        elif kind in _STATEMENT_END:
            self.value = None
        elif self.value is not None:
            problem = self.value.step(token)
            if problem is not None:
                # Skip the rest of the statement as after a syntax error: the
                # setting is dropped and no tree of it is built.
                span, message, note = problem
                self.diagnostics.append(Diagnostic(self.path, span, message, note=note))
                self.skipping = True
                self.value = None
        at_boundary = (self.in_block and kind in {"_NL", "SEMICOLON", "LBRACE"}) or (
            not self.in_block and not self.in_header and kind in {"_NL", "RBRACE"}
        )
        if at_boundary:
            self.checkpoint = self.ip.parser_state.copy(deepcopy_values=False)

    def _finish(self) -> Tree | None:
        end = self._end_token()
        if self.skipping:
            self._restore()
        if self.in_block:
            if "RBRACE" not in self._accepts():
                # The last statement is incomplete as well as the block.
                self._error(end, self._unexpected_message(end))
                self._restore()
            self._close_block_before(end)
        try:
            return self.ip.feed_token(end)
        except UnexpectedToken:
            # At the top level only an unfinished block header can be cut off.
            self._error(end, self._unexpected_message(end))
            return None

    def _end_token(self) -> Token:
        line = self.text.count("\n") + 1
        column = len(self.text) - (self.text.rfind("\n") + 1) + 1
        return Token("$END", "", len(self.text), line, column, line, column, len(self.text))

    # -- errors ------------------------------------------------------------- #

    def _bad_character(self, bad: _BadCharacter) -> None:
        shown = _quote_char(bad.char)
        note = _CHARACTER_HINTS.get(bad.char)
        if note is None:
            expected = self._expected_words(self._accepts())
            message = f"unexpected character {shown}; expected {expected}"
        else:
            message = f"unexpected character {shown}"
        self.diagnostics.append(Diagnostic(self.path, bad.span, message, note=note))
        self.skipping = True

    def _unexpected(self, token: Token) -> None:
        if token.type == "ATTENTION" and self.in_block:
            # Most likely a forgotten `}`: close the block and carry on with
            # the next one.
            self._error(
                token,
                f"expected '}}' to close the block '{self.block_name}' "
                f"started at line {self.block_keyword.line}, found keyword 'attention'",
            )
            if "RBRACE" not in self._accepts():
                self._restore()
            self._close_block_before(token)
            self._feed_or_give_up(token)
            return
        self._error(token, self._unexpected_message(token))
        if self._resumes(token):
            self._restore()
            self._feed_or_give_up(token)
        else:
            self.skipping = True

    def _close_block_before(self, token: Token) -> None:
        if token.type == "$END":
            header, name = self.block_keyword, self.block_name
            self.diagnostics.append(
                Diagnostic(
                    self.path,
                    ir.Span(header.line, header.column, name.end_line, name.end_column),
                    f"unterminated block '{self.block_name}': "
                    "expected '}' before the end of the file",
                    note=f"the block starts at line {header.line}; the file ends "
                    f"at line {max(1, len(self.text.splitlines()))} without its '}}'",
                )
            )
        self._feed_or_give_up(Token.new_borrow_pos("RBRACE", "}", token))

    def _error(self, token: Token, message: str) -> None:
        self.diagnostics.append(Diagnostic(self.path, _token_span(token), message))

    def _unexpected_message(self, token: Token) -> str:
        accepts = self._accepts()
        found = token.type
        if found == "EQUAL" and "EQ" in accepts:
            return "unexpected '='; use '==' to compare"
        if found == "EQ" and "EQUAL" in accepts:
            return "expected '=' after the setting name, found '=='"
        if found in _COMPARISON_TERMINALS and "PLUS" in accepts and "EQ" not in accepts:
            return "comparisons do not chain: write `a < b & b < c` instead of `a < b < c`"
        if found in ("RPAR", "RSQB") and not self.open_parens:
            return f"unmatched '{token}'"
        closer = {"LPAR": ("RPAR", ")"), "LSQB": ("RSQB", "]")}
        if self.open_parens:
            paren = self.open_parens[-1]
            kind, char = closer[paren.type]
            if (
                kind in accepts
                and "INT" not in accepts  # an operand is complete
                and found in _STATEMENT_END | {"$END"}
            ):
                return (
                    f"expected '{char}' to close the '{paren}' at line {paren.line}, "
                    f"column {paren.column}, found {_describe(token)}"
                )
        return f"expected {self._expected_words(accepts)}, found {_describe(token)}"

    def _expected_words(self, accepts: set[str]) -> str:
        """What the parser would have accepted, in words."""
        if _OPERAND_START <= accepts:
            return "an expression or ')'" if "RPAR" in accepts else "an expression"
        if accepts == {"LEARNABLE", "NAME"}:  # after `name:`
            return "an element type such as int32 or fp32 (after 'learnable' if it is one)"
        if accepts == {"LSQB"}:  # `name: type` before its '['
            return "'[' and the input's sizes"
        if "COLON" in accepts and "EQUAL" in accepts:
            return "'=' after the setting name, or ':' to declare an input"
        if self.in_header:
            if "NAME" in accepts:
                return "a block name after 'attention'"
            return "'{' after the block name"
        if "ATTENTION" in accepts and not self.in_block:
            return "'attention' to start a block"
        if "EQUAL" in accepts:
            return "'=' after the setting name"
        if "NAME" in accepts and "RBRACE" in accepts:
            return "a setting name or '}'"
        if accepts & _BINARY_OPERATOR_TERMINALS:
            words = ["an operator"]
            if "COMMA" in accepts:
                words.append("','")
            if "RPAR" in accepts:
                words.append("')'")
            if "RSQB" in accepts:
                words.append("']'")
            if accepts & _STATEMENT_END:
                words.append("the end of the statement")
            return _or_list(words)
        return _or_list([self._terminal_words(name) for name in sorted(accepts)])

    def _terminal_words(self, name: str) -> str:
        if name in _TERMINAL_WORDS:
            return _TERMINAL_WORDS[name]
        terminal = self.terminals.get(name)
        if terminal is not None and terminal.pattern.type == "str":
            return f"'{terminal.pattern.value}'"
        return name.lower()


class _ValueLimits:
    """Follows one setting's value token by token, so that an expression far
    over the size limits is diagnosed before a tree of it is built.

    Every ir node has exactly one token (a name, a number, an operator, a
    called function's name), so the count of parts is exact.  The nesting
    counted here (open parentheses and calls, unary operators whose operand
    has not ended) is a lower bound; operator nesting is measured on the tree
    of what passes here (`_size_problem`).
    """

    def __init__(self) -> None:
        self.parts = 0
        self.levels: list[str] = []  # "(" or "-" (a unary operator)
        self.expect_operand = True
        self.previous: Token | None = None

    def step(self, token: Token) -> tuple[ir.Span, str, str] | None:
        kind = token.type
        opened = None
        if kind in ("MINUS", "NOT") and self.expect_operand:
            self.parts += 1
            self.levels.append("-")
            opened = token
        elif kind in _BINARY_OPERATOR_TERMINALS or kind in ("COMMA", "RPAR", "RSQB"):
            # A unary operator's operand ends at the next binary operator
            # (negation binds tighter than all of them), ',', ')' or ']'.
            while self.levels and self.levels[-1] == "-":
                self.levels.pop()
            if kind in ("RPAR", "RSQB") and self.levels:
                self.levels.pop()
            self.parts += kind in _BINARY_OPERATOR_TERMINALS
        elif kind in ("LPAR", "LSQB"):
            self.levels.append("(")
            called = self.previous is not None and self.previous.type == "NAME"
            opened = self.previous if called else token
        elif kind in ("NAME", "INT", "REAL"):
            self.parts += 1
        self.expect_operand = kind not in ("NAME", "INT", "REAL", "RPAR", "RSQB")
        self.previous = token
        if opened is not None and len(self.levels) > ir.MAX_EXPR_DEPTH:
            return (_span(opened), *expression_too_deep())
        if self.parts > ir.MAX_EXPR_NODES:
            return (_span(token), *expression_too_large())
        return None


def _describe(token: Token) -> str:
    """A found token, in words."""
    kind = token.type
    if kind == "$END":
        return "the end of the file"
    if kind == "_NL":
        return "the end of the line"
    if kind == "NAME":
        return f"name '{token}'"
    if kind == "INT":
        return f"integer {token}"
    if kind == "REAL":
        return f"number {token}"
    if kind in {"ATTENTION", "DIV", "LEARNABLE"}:
        return f"keyword '{token}'"
    return f"'{token}'"


def _token_span(token: Token) -> ir.Span:
    if token.type in {"_NL", "$END"}:
        # Point at the spot where the line (or file) ends, not across lines.
        return ir.Span(token.line, token.column, token.line, token.column)
    return _span(token)


def _quote_char(char: str) -> str:
    if char in "'\\":
        return f"'\\{char}'"
    if char.isprintable():
        return f"'{char}'"
    return repr(char)  # e.g. '\x00' or '\u200b'


def _or_list(words: list[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]
