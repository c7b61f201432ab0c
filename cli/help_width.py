"""Help that fits the terminal: option names never cut, paragraphs wrapped to the width.

typer lays each help panel out as a rich table whose columns all shrink together when the
terminal is narrower than the table: off a terminal (a pipe, a file, an agent's shell) rich
assumes 80 columns, and the longest option names came out as `--max-episode-mib-per-clie…`,
which cannot be typed back. Marked `no_wrap`, a column of option names keeps its width and the
description column, which wraps, gives up the room instead. On a wide terminal (or with
`COLUMNS` set) the table takes the terminal's width, as before.
"""

from __future__ import annotations

from typing import Any

import typer.rich_utils
from rich.table import Table
from rich.text import Text


class _WholeNames(Table):
    """A rich table whose columns of option names (cells starting `-`) never shrink or wrap."""

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        super().add_row(*renderables, **kwargs)
        for column, cell in zip(self.columns, renderables, strict=False):
            if isinstance(cell, Text) and cell.plain.startswith("-"):
                column.no_wrap = True


def _joined_paragraphs(paragraphs: list[str], markup_mode: Any) -> str:
    """A command's help after its first paragraph, each paragraph one line for rich to wrap to the
    width it has (typer keeps the docstring's own line breaks there, so at any width but the
    source's the text came out ragged: "or numbering" / "steps; stiff = ..."). A paragraph that
    opens with click's `\b` keeps its lines."""
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split("\n")) for p in paragraphs)


def keep_option_names_whole() -> None:
    """Lay typer's help panels out with `_WholeNames` (typer builds them from its module's `Table`),
    and wrap help paragraphs to the terminal's width (`_joined_paragraphs`)."""
    typer.rich_utils.Table = _WholeNames  # type: ignore[attr-defined]
    typer.rich_utils._fix_linebreaks = _joined_paragraphs
