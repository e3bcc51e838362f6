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

This is the only module that imports lark; it builds ir nodes and nothing
else, so no text of a spec is ever evaluated.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
from collections.abc import Iterator
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedToken
from lark.parsers.lalr_interactive_parser import InteractiveParser

from flashgen import ir
from flashgen.diagnostics import Diagnostic

__all__ = ["parse"]


def parse(text: str, path: str = "<string>") -> tuple[ir.SpecFile | None, list[Diagnostic]]:
    """Parse one `.attn` file.  See the module docstring for the contract."""
    parser = _Recovering(text, path)
    tree = parser.run()
    if tree is None and not parser.diagnostics:  # recovery gave up; never silently
        parser.diagnostics.append(Diagnostic(path, ir.Span(1, 1, 1, 1), "cannot parse this file"))
    if parser.diagnostics:
        return None, parser.diagnostics
    builder = _ToIR(path)
    blocks = builder.transform(tree)
    if builder.diagnostics:
        return None, builder.diagnostics
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
class _ToIR(Transformer):
    """One method per grammar rule (or alias), each building the ir node of that name."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.diagnostics: list[Diagnostic] = []

    def spec_file(self, meta, *blocks: ir.Block) -> tuple[ir.Block, ...]:
        return blocks

    def block(self, meta, keyword: Token, name: Token, *settings: ir.Setting) -> ir.Block:
        return ir.Block(
            name=str(name),
            settings=settings,
            span=_span(meta),
            name_span=_span(name),
        )

    def setting(self, meta, key: Token, value: ir.Expr) -> ir.Setting:
        return ir.Setting(key=str(key), value=value, span=_span(meta), key_span=_span(key))

    def binary(self, meta, left: ir.Expr, op: Token, right: ir.Expr) -> ir.Binary:
        return ir.Binary(_BINARY_OPS[op.type], left, right, span=_span(meta))

    def unary(self, meta, op: Token, operand: ir.Expr) -> ir.Unary:
        return ir.Unary(_UNARY_OPS[op.type], operand, span=_span(meta))

    def call(self, meta, fn: Token, *args: ir.Expr) -> ir.Call:
        return ir.Call(str(fn), args, span=_span(meta))

    def name(self, meta, token: Token) -> ir.Name:
        return ir.Name(str(token), span=_span(meta))

    def int(self, meta, token: Token) -> ir.Num:
        digits = str(token).lstrip("0") or "0"
        if len(digits) > _MAX_INT_DIGITS:
            self.diagnostics.append(
                Diagnostic(self.path, _span(token), "integer literal is too large")
            )
            return ir.Num(0, span=_span(meta))
        return ir.Num(int(digits), span=_span(meta))

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
    "[": "the language has no indexing",
    "]": "the language has no indexing",
    ":": "settings are written `name = value`",
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
        if not self.in_block:
            self.in_header = False

    # -- feeding ------------------------------------------------------------ #

    def _feed(self, token: Token) -> None:
        saved = self.ip.parser_state.copy(deepcopy_values=False)
        try:
            self.ip.feed_token(token)
        except UnexpectedToken:
            # LALR may have reduced before noticing; go back to a clean state.
            self.ip.parser_state = saved
            self._unexpected(token)
        else:
            self._advanced(token)

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
        elif kind == "LPAR":
            self.open_parens.append(token)
        elif kind == "RPAR" and self.open_parens:
            self.open_parens.pop()
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
            if "RBRACE" not in self.ip.accepts():
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
            expected = self._expected_words(self.ip.accepts())
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
            if "RBRACE" not in self.ip.accepts():
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
        accepts = self.ip.accepts()
        found = token.type
        if found == "EQUAL" and "EQ" in accepts:
            return "unexpected '='; use '==' to compare"
        if found in _COMPARISON_TERMINALS and "PLUS" in accepts and "EQ" not in accepts:
            return "comparisons do not chain: write `a < b & b < c` instead of `a < b < c`"
        if found == "RPAR" and not self.open_parens:
            return "unmatched ')'"
        if (
            self.open_parens
            and "RPAR" in accepts
            and "INT" not in accepts  # an operand is complete
            and found in _STATEMENT_END | {"$END"}
        ):
            paren = self.open_parens[-1]
            return (
                f"expected ')' to close the '(' at line {paren.line}, "
                f"column {paren.column}, found {_describe(token)}"
            )
        return f"expected {self._expected_words(accepts)}, found {_describe(token)}"

    def _expected_words(self, accepts: set[str]) -> str:
        """What the parser would have accepted, in words."""
        if _OPERAND_START <= accepts:
            return "an expression or ')'" if "RPAR" in accepts else "an expression"
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
    if kind in {"ATTENTION", "DIV"}:
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
