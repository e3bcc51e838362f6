"""`flashgen.display`: plain-text tables and the progress bar, through rich."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from flashgen.display import Column, Progress, table


def test_a_table_is_a_header_a_rule_and_rows_as_plain_ascii():
    text = table(
        [Column("name"), Column("n", "right"), Column("note")],
        [["tiny", "7", "[bold]kept[/] as typed"], ["a_longer_name", "12345", ""]],
    )
    assert text.splitlines() == [
        "name               n  note",
        "-" * 44,
        "tiny               7  [bold]kept[/] as typed",
        "a_longer_name  12345",
    ]
    assert text.isascii()


def test_fixed_width_cells_keep_their_spaces_under_a_right_justified_header():
    """Cells formatted to one width (a slot for a mark at the end) keep it, so
    the separators inside them line up; the header sits over their right edge."""
    cells = ["   628/  452h", "  1628/   45 ", "     -/    - "]
    columns = [Column("flashgen", "right", fixed_width=True), Column("x")]
    lines = table(columns, [[cell, "."] for cell in cells]).splitlines()
    assert lines[0] == "     flashgen  x"
    assert [line.index("/") for line in lines[2:]] == [6, 6, 6]
    assert [line.index(".") for line in lines[2:]] == [15, 15, 15]


def test_a_long_row_is_never_wrapped():
    text = table([Column("a"), Column("b")], [["x" * 150, "y" * 150]])
    assert text.splitlines()[2] == "x" * 150 + "  " + "y" * 150


def test_an_empty_table_has_its_header():
    assert table([Column("a"), Column("bb", "right")], []) == "a  bb\n-----"


def _steps(bar: Progress) -> None:
    bar.start("tiny N=32 flashgen: compiling and timing")
    bar.advance("tiny N=32 flashgen")
    bar.advance("tiny N=32 sdpa-cudnn: not expressible")  # a step skipped
    bar.start("tiny N=32 [flex]: compiling and timing")
    bar.advance("tiny N=32 [flex]")


def test_progress_off_a_terminal_is_a_plain_line_per_step():
    out = io.StringIO()
    with Progress(3, console=Console(file=out)) as bar:
        _steps(bar)
    assert out.getvalue().splitlines() == [
        "[1/3] tiny N=32 flashgen: compiling and timing",
        "[2/3] tiny N=32 sdpa-cudnn: not expressible",
        "[3/3] tiny N=32 [flex]: compiling and timing",
    ]
    assert bar.done == 3


def test_progress_disabled_writes_nothing():
    out = io.StringIO()
    with Progress(3, enabled=False, console=Console(file=out, force_terminal=True)) as bar:
        _steps(bar)
    assert out.getvalue() == ""


def test_progress_on_a_terminal_is_a_live_bar_stopped_on_the_way_out():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with pytest.raises(KeyboardInterrupt):
        with Progress(3, console=console) as bar:
            _steps(bar)
            assert bar._bar is not None and bar._bar.live.is_started
            raise KeyboardInterrupt
    assert not bar._bar.live.is_started
    final = out.getvalue().rsplit("\r", 1)[-1]
    assert "tiny N=32 [flex]" in final and "3/3" in final
    assert "[1/3]" not in out.getvalue()  # no plain lines on a terminal
