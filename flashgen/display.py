"""What flashgen shows a person: plain-text tables and a progress bar.

In: rows of cells (already formatted strings) and progress steps.  Out: text.
The only user of rich; bench and verify build their tables and progress here.

Tables are plain ASCII whatever the output is (a terminal, a file that
scripts/gpu_bench.sh tees, a CI log): a header, a rule of dashes, then one
line per row, each column as wide as its widest cell, two spaces between
columns and no trailing spaces.  Cells are shown verbatim: no markup, no
wrapping, no colour.

The progress bar goes to stderr.  On a terminal it is rich's live bar; where
stderr is not a terminal (a file, a pipe, a CI log) it writes one plain line
as each step starts, so that a run stopped by a time limit shows what it was
doing, and no control characters reach the log.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

import rich.progress
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["Column", "Progress", "table"]

# No edges and no lines between rows: only a rule of dashes under the header,
# in ASCII (a box of rich's own would draw it with U+2500).
_HEADER_RULE = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


@dataclass(frozen=True)
class Column:
    """A table column: its header, and how cells narrower than it sit in it.

    `fixed_width`: every cell of the column is already formatted to one width
    (numbers aligned on a separator inside the cell, a one-character slot for
    a mark): its cells are shown with all their spaces, and `justify` places
    the header alone.
    """

    header: str
    justify: Literal["left", "right"] = "left"
    fixed_width: bool = False


def table(columns: Sequence[Column], rows: Iterable[Sequence[str]]) -> str:
    """`rows` under `columns`' headers and a rule, as plain text (no final newline)."""
    grid = Table(box=_HEADER_RULE, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    # rich strips a cell's trailing spaces when it right-justifies it, but
    # keeps them when it left-justifies: fixed-width cells are left-justified.
    justify = [("left" if c.fixed_width else c.justify) for c in columns]
    for c, j in zip(columns, justify):
        grid.add_column(Text(c.header, justify=c.justify), justify=j, no_wrap=True)
    for row in rows:
        grid.add_row(*(Text(cell, justify=j) for cell, j in zip(row, justify)))
    console = Console(
        file=io.StringIO(),
        width=1 << 16,  # never wrap: a long row stays one line
        color_system=None,
        force_terminal=False,
        legacy_windows=False,
        markup=False,
        emoji=False,
        highlight=False,
    )
    console.print(grid)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())


class Progress:
    """Progress through `total` steps, on stderr (or `console`).

    `start(label)` says what the next step does; `advance(label)` counts a
    step as done.  On a terminal: a live bar (label, bar, steps done of
    `total`, time elapsed), left on screen when the run ends.  Elsewhere: one
    line "[i/total] label" for each `start`, and for each `advance` that had
    no `start` (a step skipped).  Disabled (`enabled=False`), it writes
    nothing.  Use it as a context manager: the live bar stops on the way
    out, whatever happens inside.
    """

    def __init__(self, total: int, *, enabled: bool = True, console: Console | None = None):
        self.total, self.done = total, 0
        self.enabled = enabled
        self.console = console or Console(stderr=True, markup=False, highlight=False)
        self._started = False  # a start() not yet advanced past
        self._bar: rich.progress.Progress | None = None
        if enabled and self.console.is_terminal and not self.console.is_dumb_terminal:
            self._bar = rich.progress.Progress(
                rich.progress.TextColumn("{task.description}", markup=False),
                rich.progress.BarColumn(),
                rich.progress.MofNCompleteColumn(),
                rich.progress.TimeElapsedColumn(),
                console=self.console,
            )
            self._task = self._bar.add_task("", total=total)

    def __enter__(self) -> Progress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def start(self, label: str) -> None:
        """The next step has begun; `label` says what it does."""
        if self._bar is not None:
            self._bar.update(self._task, description=label)
        elif self.enabled:
            self._line(label)
        self._started = True

    def advance(self, label: str) -> None:
        """One more step done; `label` says which (or why it was skipped)."""
        if self._bar is None and self.enabled and not self._started:
            self._line(label)
        self.done += 1
        self._started = False
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, description=label)

    def _line(self, label: str) -> None:
        self.console.out(f"[{self.done + 1}/{self.total}] {label}", highlight=False)
