"""Plain-text tables for the jobs app's management commands."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def write_table(
    out: Any, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, empty: str
) -> None:
    """``columns`` then ``rows``, each column as wide as its widest cell; the sentence
    ``empty`` instead when there is no row."""
    if not rows:
        out.write(empty)
        return
    lines = [list(columns), *[list(row) for row in rows]]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(columns))]
    for line in lines:
        out.write("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
