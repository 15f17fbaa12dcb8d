"""The picture of a run on its admin page: every checkpoint in the order the body
reached it, drawn as a chain of boxes in plain SVG (no script, no outside resource).

Each box says what the checkpoint is (kind and key), where it stands (status, tries),
how long it took, and for a wait what it waits for and until when; a map is one box
with its items counted by status and drawn as a bar; a child box links to the child
run's own page. At the foot of each box a thin bar on a grey track places the
checkpoint on the run's own time line, so a long wait or a slow step stands out at a
glance. A legend under the end marker says what the two kinds of bar mean, and the end
label is wrapped to the drawing's width, never cut.

:func:`layout` computes the geometry from a :class:`~workflows.types.RunSnapshot`
(plain values, tested without a browser); the template
``admin/workflows/picture.html`` draws it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from .types import ItemCounts, RunSnapshot, RunStatus, StepKind, StepSnapshot, StepStatus, Wait

#: Drawing sizes, in SVG user units (pixels at 100 %).
WIDTH = 760
BOX_X = 60
BOX_WIDTH = 660
BOX_HEIGHT = 64
GAP = 26
END_RADIUS = 14
TOP = 16
#: The end label's lines: at most this many characters each (at 13 px, bold, about
#: 8 px each: the room right of the end marker), this far apart.
END_LABEL_CHARS = 40
LINE_HEIGHT = 17
#: Rough widths of a character at 13 px, for what must fit on a box's first line: a
#: bold sans-serif one (the kind, the state) and a monospace one (the key).
BOLD_CHAR = 7.6
MONO_CHAR = 7.9
#: The legend under the end marker: its rows' height and the sample bar's width.
LEGEND_ROW = 22
LEGEND_SAMPLE = 48
#: The legend's caption of the items' colours, and the room it takes.
ITEMS_CAPTION = "a map's items:"
ITEMS_CAPTION_WIDTH = 100
#: Where the drawing's fixed lines fall, for the template (derived from the sizes
#: above, so that the template repeats none of them).
GEOMETRY = {
    "centre": BOX_X + BOX_WIDTH // 2,
    "box_x": BOX_X,
    "box_width": BOX_WIDTH,
    "box_height": BOX_HEIGHT,
    "text_x": BOX_X + 14,
    "state_x": BOX_X + BOX_WIDTH - 14,
    "label_x": BOX_X + BOX_WIDTH // 2 + 2 * END_RADIUS - 4,
    "line_x": BOX_X + 12,
    "line_width": BOX_WIDTH - 24,
    "radius": END_RADIUS,
    "legend_x": BOX_X,
    "legend_text_x": BOX_X + LEGEND_SAMPLE + 10,
    "legend_sample": LEGEND_SAMPLE,
}

#: Fill and stroke per status (readable in print and for colour-blind readers: the
#: status is also written in every box).
COLOURS: dict[str, tuple[str, str]] = {
    StepStatus.SUCCEEDED: ("#e8f5e9", "#2e7d32"),
    StepStatus.FAILED: ("#fdecea", "#c62828"),
    StepStatus.RUNNING: ("#e3f2fd", "#1565c0"),
    StepStatus.WAITING: ("#fff8e1", "#b7791f"),
    StepStatus.CANCELLED: ("#f0f0f0", "#616161"),
}

#: The items' statuses in the order the map's bar draws them.
ITEM_ORDER = ("succeeded", "failed", "running", "cancelled", "pending")
ITEM_COLOURS = {
    "succeeded": "#43a047",
    "failed": "#e53935",
    "running": "#1e88e5",
    "cancelled": "#9e9e9e",
    "pending": "#e0e0e0",
}


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of a bar: where it starts, how wide it is, its colour and label."""

    x: float
    width: float
    colour: str
    label: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    """One checkpoint's box."""

    y: int
    kind: str
    key: str
    #: The key as drawn: shortened with "…" when it would run into the state.
    key_label: str
    status: str
    fill: str
    stroke: str
    #: The first line's right side: "succeeded, 2 tries" and the like.
    state: str
    #: The second line: duration, what a wait waits for, a map's counts, the error.
    detail: str
    #: A child run's admin page ("" for other kinds).
    link: str = ""
    #: The map's items as a bar (empty for other kinds).
    items: list[Segment] = field(default_factory=list)
    #: Where the checkpoint lies on the run's time line (x and width under the box).
    when: Segment | None = None


@dataclass(frozen=True, slots=True)
class LegendEntry:
    """A colour of the map's items bar and what it stands for, placed at ``x``."""

    x: float
    colour: str
    label: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Legend:
    """What the bars mean: the time line under every box, and (when the run has a
    map) the colours of a map's items bar."""

    y: int
    time_line: str
    #: The items' colours, in the bar's order (empty: the run has no map).
    items: list[LegendEntry]
    items_y: int
    items_caption: str = ITEMS_CAPTION


@dataclass(frozen=True, slots=True, kw_only=True)
class Picture:
    """Everything the template draws."""

    width: int
    height: int
    nodes: list[Node]
    #: The end marker: the run's status, or what it waits for.
    end_y: int
    end_label: str
    #: The end label as drawn: wrapped, each line with its baseline.
    end_lines: list[tuple[int, str]]
    end_fill: str
    end_stroke: str
    start_label: str
    legend: Legend
    #: A sentence for screen readers and the page's text.
    summary: str


def duration(seconds: float) -> str:
    """``850 ms``, ``12.4 s``, ``3 min 5 s``, ``2 h 10 min``, ``3 d 4 h``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86_400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86_400} d {whole % 86_400 // 3600} h"


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment is not None else "?"


def _item_segments(counts: ItemCounts) -> list[Segment]:
    pending = max(counts.total - counts.succeeded - counts.failed - counts.running, 0)
    pending = max(pending - counts.cancelled, 0)
    values = {
        "succeeded": counts.succeeded,
        "failed": counts.failed,
        "running": counts.running,
        "cancelled": counts.cancelled,
        "pending": pending,
    }
    total = sum(values.values()) or 1
    width = BOX_WIDTH - 24
    x = float(BOX_X + 12)
    segments = []
    for name in ITEM_ORDER:
        if values[name]:
            part = width * values[name] / total
            segments.append(Segment(x, part, ITEM_COLOURS[name], f"{values[name]} {name}"))
            x += part
    return segments


def _counts_text(counts: ItemCounts) -> str:
    ended = counts.succeeded + counts.failed + counts.cancelled
    parts = [f"{ended} of {counts.total} items ended"]
    for name in ("succeeded", "failed", "running", "cancelled"):
        value = getattr(counts, name)
        if value:
            parts.append(f"{value} {name}")
    return ", ".join(parts)


def _detail(step: StepSnapshot, now: datetime) -> str:
    end = step.finished_at or now
    took = duration((end - step.started_at).total_seconds())
    if step.status == StepStatus.WAITING:
        if step.kind == StepKind.SLEEP:
            return f"timer until {_when(step.wake_at)}"
        if step.kind == StepKind.SIGNAL:
            deadline = f", timeout at {_when(step.wake_at)}" if step.wake_at else ""
            return f"waiting for signal {step.key!r}{deadline}"
        if step.kind == StepKind.CHILD:
            return f"waiting for child run {step.child_run_id or '?'}"
        if step.wake_at is not None:
            return f"next try at {_when(step.wake_at)} ({step.error or 'retrying'})"
    if step.items is not None and step.kind == StepKind.MAP:
        return f"{_counts_text(step.items)} · {took}"
    if step.status == StepStatus.FAILED and step.error:
        return f"{step.error} · {took}"
    verb = "took" if step.finished_at is not None else "for"
    return f"{verb} {took}"


def _fitted_key(key: str, kind: str, state: str) -> str:
    """``key``, or its start and "…" when the whole would run into ``state`` on the
    box's first line (the whole key is the box's tooltip)."""
    room = BOX_WIDTH - 28 - 16 - BOLD_CHAR * (len(kind) + len(state) + 2)
    fits = max(int(room / MONO_CHAR), 8)
    return key if len(key) <= fits else key[: fits - 1] + "…"


def _state(step: StepSnapshot) -> str:
    state = StepStatus(step.status).label.lower()
    if step.attempts > 1:
        state += f", {step.attempts} tries"
    return state


def layout(
    run: RunSnapshot,
    *,
    now: datetime,
    child_link: Callable[[str], str] = lambda run_id: "",
) -> Picture:
    """The picture of ``run`` as of ``now`` (for the durations of what has not ended).

    ``child_link(run_id)`` gives a child run's admin page ("" when it has none).
    """
    begin = run.created_at
    end = run.finished_at or now
    span = max((end - begin).total_seconds(), 1e-6)
    line_width = BOX_WIDTH - 24

    nodes: list[Node] = []
    y = TOP + 2 * END_RADIUS + GAP
    for step in run.steps:
        fill, stroke = COLOURS.get(step.status, COLOURS[StepStatus.WAITING])
        start = (step.started_at - begin).total_seconds()
        stop = ((step.finished_at or now) - begin).total_seconds()
        x = BOX_X + 12 + line_width * min(max(start / span, 0.0), 1.0)
        # At least a visible mark: a 2 px sliver with rounded ends read as a stray comma.
        width = min(max(line_width * max(stop - start, 0.0) / span, 6.0), line_width)
        x = min(x, BOX_X + 12 + line_width - width)  # a late mark stays on the line
        kind, state = StepKind(step.kind).label, _state(step)
        nodes.append(
            Node(
                y=y,
                kind=kind,
                key=step.key,
                key_label=_fitted_key(step.key, kind, state),
                status=str(step.status),
                fill=fill,
                stroke=stroke,
                state=state,
                detail=_detail(step, now),
                link=child_link(step.child_run_id) if step.child_run_id else "",
                items=_item_segments(step.items)
                if step.items is not None and step.kind == StepKind.MAP
                else [],
                when=Segment(x, width, stroke, f"{start:.3f}s to {stop:.3f}s"),
            )
        )
        y += BOX_HEIGHT + GAP

    end_fill, end_stroke = COLOURS.get(run.status, COLOURS[StepStatus.WAITING])
    if run.status == RunStatus.WAITING and run.wait is not None:
        end_label = f"waiting: {_wait_label(run, run.wait)}"
    elif run.status == RunStatus.FAILED and run.failed_step:
        end_label = f"failed at {run.failed_step!r}"
    else:
        end_label = RunStatus(run.status).label.lower()
    if run.finished_at is not None:
        end_label += f" · {duration(span)} in all"
    summary = (
        f"Run {run.run_id} of {run.name} v{run.version}: {len(run.steps)} checkpoints, {end_label}."
    )
    end_y = y + END_RADIUS
    # A long key or wait would run past the drawing's right edge: wrapped, whole.
    wrapped = textwrap.wrap(end_label, END_LABEL_CHARS, break_on_hyphens=False) or [""]
    end_lines = [(end_y + 4 + n * LINE_HEIGHT, line) for n, line in enumerate(wrapped)]
    legend_y = max(end_y + END_RADIUS, end_lines[-1][0]) + GAP
    legend = _legend(run, legend_y)
    return Picture(
        width=WIDTH,
        height=(legend.items_y if legend.items else legend.y) + LEGEND_ROW // 2 + TOP,
        nodes=nodes,
        end_y=end_y,
        end_label=end_label,
        end_lines=end_lines,
        end_fill=end_fill,
        end_stroke=end_stroke,
        start_label=f"started {_when(run.created_at)}",
        legend=legend,
        summary=summary,
    )


def _wait_label(run: RunSnapshot, wait: Wait) -> str:
    """What the run waits for, from its data: a map's items counted from its
    checkpoint's box, times as every box writes them."""
    waited_at = run.step(wait.key) if wait.key else None
    return wait.describe(waited_at.items if waited_at is not None else None, at=_when)


def _legend(run: RunSnapshot, y: int) -> Legend:
    """The legend's rows from ``y`` down: the time line, then the items' colours if
    the run has a map."""
    until = "its end" if run.finished_at is not None else "now"
    has_map = any(step.kind == StepKind.MAP for step in run.steps)
    entries: list[LegendEntry] = []
    x = float(GEOMETRY["legend_text_x"] + ITEMS_CAPTION_WIDTH)
    for name in ITEM_ORDER if has_map else ():
        entries.append(LegendEntry(x, ITEM_COLOURS[name], name))
        x += 12 + 8 * len(name) + 18  # the square, the word, a space
    return Legend(
        y=y,
        time_line=f"when each checkpoint ran, on the run's time line from its start to {until}",
        items=entries,
        items_y=y + LEGEND_ROW,
    )
