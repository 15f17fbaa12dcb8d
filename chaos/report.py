"""The verdict table and the conditions of a run, as Markdown (readable in a terminal)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .checker import Verdict


def row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return "\n".join([row(headers), row(["---"] * len(headers)), *(row(r) for r in rows)])


def verdicts(found: Sequence[Verdict]) -> str:
    return table(
        ["Check", "Promise", "Expected", "Found", "Verdict"],
        [
            [
                v.check,
                v.promise,
                v.expected,
                v.found,
                "ok" if v.ok else f"**{v.violations} violation(s)**: {', '.join(v.offenders)}",
            ]
            for v in found
        ],
    )


def conditions(items: dict[str, Any]) -> str:
    return table(["Condition", ""], [[k, v] for k, v in items.items()])
