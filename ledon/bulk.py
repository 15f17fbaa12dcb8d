"""Acting on every row a filter matches, not only on the rows ticked on one page: what
``manage.py bulk_jobs``, the admins' "all N matching" actions (:mod:`ledon.bulk_admin`)
and any other app's bulk operations share.

An app describes one operation as a :class:`BulkAction`: its dry run (``preview``: how
many of the matching rows each outcome would take, counted now) and one batch
(``apply``: a short transaction of its store's guarded statements over a list of ids,
returning a :class:`BatchOutcome`). :func:`run_bulk` does the rest, the same way for
every app:

- the rows are those the filter matches when the run starts: none with an id above the
  largest matching then (``up_to``), so a job submitted during the run is not touched;
- their ids are read page by page in id order, a plain read outside any write
  transaction, and each page is handed to ``apply``: a batch holds its locks only for
  its own statements, on at most ``batch_size`` rows;
- the store's transition rules decide, not the filter: a row that moved on since its
  page was read is changed as its state now allows (a Queued job a worker claimed
  meanwhile gets a cancel request), or skipped;
- on PostgreSQL a batch takes only the rows no other transaction holds (``SKIP
  LOCKED``, :func:`lock_batch`): it never waits for a claim, a heartbeat or a finish,
  and never makes one wait for it beyond its own short transaction. The rows it
  skipped are tried again after the pass, a few times (:data:`HELD_TRIES`), and counted
  as ``held`` if they are still taken;
- on SQLite, whose one write lock has no queue, the run pauses between two batches
  (:func:`let_writers_in`) so that a worker waiting for the lock gets it;
- ``on_batch`` hears the progress after each batch; a :class:`BulkReport` says what
  happened at the end.

Fault point (see :mod:`ledon.faults`), for tests of what moves meanwhile:

``ledon.bulk.page``
    a page of ids is read, its batch not yet applied (``ids``, ``verb``).

:class:`BulkFilter` is the filter of a bulk command's options (a status, a name, a scope,
a creation-time window, a piece of the error, tags), checked here once for every app;
each app turns one into its rows (:meth:`BulkFilter.narrow` reads the conditions every
app reads alike).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Max, Q, QuerySet

from . import validation
from .db import alias_for, in_caller_atomic_block
from .faults import fault_point

#: Rows per batch unless the caller says otherwise, and the most it may say.
DEFAULT_BATCH = 500
MAX_BATCH = 10_000

#: Passes over the rows other transactions held during the main pass, and the pause
#: before the first of them (doubled before each next one).
HELD_TRIES = 5
HELD_PAUSE = 0.05

#: Seconds between two batches on SQLite (see :func:`let_writers_in`).
SQLITE_BATCH_PAUSE = 0.1

#: The longest name, scope or error text a filter takes.
MAX_FILTER_TEXT = 1000

_Rows = TypeVar("_Rows", bound=QuerySet[Any])


# --------------------------------------------------------------------------- filters


def instant(value: str, option: str, *, error: type[Exception]) -> datetime:
    """An ISO 8601 date and time given on a command line, as an aware UTC datetime: a
    date alone is its midnight, a time without an offset is read as UTC (the time zone
    the apps store everything in). ``error`` if it is not one."""
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise error(
            f"{option} must be an ISO 8601 date or date and time (2026-03-01, "
            f"2026-03-01T12:00:00+02:00), got {value!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise error(f"{option} {value!r} is out of range in UTC") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkFilter:
    """The rows a bulk command selects; None is no condition. Every condition must
    hold: ``status`` (a status value of the app), ``name`` (a job's handler, a
    workflow's or saga's name, exactly), ``scope`` (the scope string callers pass, not
    its hash), created at or after ``since`` and before ``until``, ``error_contains``
    (a piece of the stored error text, any case), ``tags`` (pairs the row carries,
    every one of them: for the apps whose rows carry tags, workflow runs)."""

    status: str | None = None
    name: str | None = None
    scope: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    error_contains: str | None = None
    tags: Mapping[str, str] | None = None

    @classmethod
    def parse(
        cls,
        *,
        statuses: Collection[str],
        error: type[Exception],
        status: str | None = None,
        name: str | None = None,
        scope: str | None = None,
        since: str | None = None,
        until: str | None = None,
        error_contains: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> BulkFilter:
        """The filter of a command's options, each checked; ``error`` (the app's typed
        error for bad input) for the first that is not valid: a status that is not one
        of ``statuses``, a time that is not ISO 8601, ``since`` not before ``until``, a
        tag that is not ``KEY=VALUE`` or a key given twice (what a tag's key and value
        may hold is the app's to check, as it checks its rows' tags)."""
        if status is not None and status not in statuses:
            raise error(f"--status must be one of {', '.join(sorted(statuses))}; got {status!r}")

        def text(value: str | None, option: str) -> str | None:
            if value is None:
                return None
            return validation.text(value, option, max_length=MAX_FILTER_TEXT, error=error)

        start = None if since is None else instant(since, "--since", error=error)
        end = None if until is None else instant(until, "--until", error=error)
        if start is not None and end is not None and start >= end:
            raise error(f"--since ({start.isoformat()}) must be before --until ({end.isoformat()})")
        return cls(
            status=status,
            name=text(name, "--name"),
            scope=text(scope, "--scope"),
            since=start,
            until=end,
            error_contains=text(error_contains, "--error-contains"),
            tags=None if tags is None else tag_pairs(tags, error=error),
        )

    def narrow(
        self, rows: _Rows, *, name_field: str, error_fields: Sequence[str] = ("error",)
    ) -> _Rows:
        """``rows`` narrowed by the conditions every app reads alike: its ``status``,
        its name (``name_field``: a job's ``handler``), created (its ``created_at``)
        within the window, and one of its ``error_fields`` holding the piece asked
        for, in any case (ASCII letters only, on SQLite). The scope and the tags are
        the app's: it hashes its scopes and stores its tags its own way."""
        if self.status is not None:
            rows = rows.filter(status=self.status)
        if self.name is not None:
            rows = rows.filter(**{name_field: self.name})
        if self.since is not None:
            rows = rows.filter(created_at__gte=self.since)
        if self.until is not None:
            rows = rows.filter(created_at__lt=self.until)
        if self.error_contains is not None:
            erring = Q()
            for name in error_fields:
                erring |= Q(**{f"{name}__icontains": self.error_contains})
            rows = rows.filter(erring)
        return rows

    @property
    def is_empty(self) -> bool:
        """No condition at all: every row."""
        return all(getattr(self, name) is None for name in self.__slots__)

    def describe(self) -> str:
        """The conditions, for a command's first line: ``status=failed, created
        since 2026-03-01T00:00:00+00:00, tag customer='42'``; ``"every row"`` without
        any."""
        parts = [
            f"{name}={getattr(self, name)!r}"
            for name in ("status", "name", "scope", "error_contains")
            if getattr(self, name) is not None
        ]
        if self.since is not None:
            parts.append(f"created since {self.since.isoformat()}")
        if self.until is not None:
            parts.append(f"created before {self.until.isoformat()}")
        parts.extend(f"tag {key}={value!r}" for key, value in (self.tags or {}).items())
        return ", ".join(parts) or "every row"


def tag_pairs(values: Sequence[str], *, error: type[Exception]) -> dict[str, str]:
    """The tags of ``--tag KEY=VALUE`` options (split at the first ``=``: a value may
    hold one), as a dict; ``error`` for one without ``=`` or a key given twice (a row
    carries one value per key: both could never match)."""
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, text = value.partition("=")
        if not sep:
            raise error(f"--tag must be KEY=VALUE (customer=42), got {value!r}")
        if key in pairs:
            raise error(
                f"--tag {key!r} is given twice ({pairs[key]!r} and {text!r}); a row carries "
                "one value per key"
            )
        pairs[key] = text
    return pairs


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchOutcome:
    """What one batch's guarded statements did: the rows ``changed``, by outcome
    (``{"cancelled": 40, "cancel requested": 2}``), and the ids of the rows another
    transaction ``held`` (PostgreSQL), left as they were to be tried again. The other
    rows of the batch were skipped: their state did not allow the change."""

    changed: Mapping[str, int]
    held: tuple[Any, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.changed.values())


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkAction:
    """One operation of an app's store over many rows, for :func:`run_bulk`.

    ``verb`` names it in messages (``"cancel"``); ``outcomes`` are the labels of the
    changes ``apply`` reports, in the order they are shown. ``preview(rows)`` counts,
    without writing, how many of ``rows`` each outcome would take now — and, under
    other labels, why the others would be skipped (``"already finished"``).
    ``apply(ids)`` runs one batch: one short transaction of the store's guarded
    statements over those ids (:func:`lock_batch` first), whatever their state."""

    verb: str
    outcomes: tuple[str, ...]
    preview: Callable[[QuerySet[Any]], Mapping[str, int]]
    apply: Callable[[Sequence[Any]], BatchOutcome]


def lock_batch(model: type[Any], ids: Sequence[Any]) -> tuple[list[Any], tuple[Any, ...]]:
    """Inside a batch's transaction, before its guarded statements: the ids among
    ``ids`` it may change, and those another transaction holds.

    On PostgreSQL the rows no other transaction holds are locked (``FOR UPDATE SKIP
    LOCKED``): the batch never waits for a claim or a finish, and nothing changes them
    until it commits. A row that no longer exists is neither. SQLite locks the whole
    database for the batch's transaction: every id may be changed.
    """
    connection = connections[alias_for(model)]
    if not connection.features.has_select_for_update_skip_locked:
        return list(ids), ()
    rows = model._default_manager.using(connection.alias).filter(pk__in=ids)
    locked = list(
        rows.order_by("pk").select_for_update(skip_locked=True).values_list("pk", flat=True)
    )
    if len(locked) == len(ids):
        return locked, ()
    taken = set(locked)
    missing = [pk for pk in ids if pk not in taken]
    held = tuple(rows.filter(pk__in=missing).order_by("pk").values_list("pk", flat=True))
    return locked, held


def let_writers_in(connection: BaseDatabaseWrapper) -> None:
    """Between two batches (of a bulk operation, of a large workflow map's items): on
    SQLite, whose one write lock has no queue, pause as long as a writer waiting for it
    takes between two tries (its busy handler retries about every 100 ms), so that the
    batches do not take the lock back before a worker (or a caller) waiting for it gets
    it. PostgreSQL locks rows, not the database: no pause."""
    if connection.vendor == "sqlite":
        time.sleep(SQLITE_BATCH_PAUSE)


# --------------------------------------------------------------------------- the run


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkProgress:
    """Where a run stands after a batch: ``done`` of the ``matched`` rows were handed to
    the store so far; of those, ``changed`` by outcome, ``skipped``, and ``held`` by
    another transaction (to be tried again)."""

    batch: int
    matched: int
    done: int
    changed: Mapping[str, int]
    skipped: int
    held: int

    def describe(self, action: BulkAction) -> str:
        """``"batch 3: 1500 of 100000 — 1490 re-queued, 10 skipped"``."""
        parts = [f"{self.changed.get(label, 0)} {label}" for label in action.outcomes]
        parts.append(f"{self.skipped} skipped")
        if self.held:
            parts.append(f"{self.held} held by other transactions, to try again")
        return f"batch {self.batch}: {self.done} of {self.matched} — {', '.join(parts)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class BulkReport:
    """What a run did (or, for a dry run, would do).

    ``matched`` rows matched the filter at the start (ids up to ``up_to``). A run
    ``changed`` some (by outcome) and ``skipped`` others (their state did not allow
    it); ``held`` were taken by other transactions on every try (run it again);
    ``gone`` no longer matched the filter, or no longer existed, when their turn came.
    A dry run changes nothing: ``changed`` is what it would change, ``skipped`` what it
    would skip, with the reasons the app gives in ``reasons``.
    """

    verb: str
    dry_run: bool
    matched: int
    up_to: Any
    changed: Mapping[str, int]
    skipped: int
    reasons: Mapping[str, int] = field(default_factory=dict)
    held: int = 0
    gone: int = 0
    batches: int = 0
    seconds: float = 0.0

    @property
    def total_changed(self) -> int:
        return sum(self.changed.values())

    def summary(self, noun: str) -> str:
        """One line for a person: what matched, what changed (or would), what was
        skipped and why, what is left to run again."""
        changes = ", ".join(f"{count} {label}" for label, count in self.changed.items())
        if self.dry_run:
            text = f"dry run: {self.matched} {noun} match; "
            text += f"would change {self.total_changed}" + (f" ({changes})" if changes else "")
            text += f", would skip {self.skipped}"
            reasons = ", ".join(f"{n} {why}" for why, n in self.reasons.items() if n)
            return text + (f" ({reasons})" if reasons else "") + "; nothing was changed"
        text = f"{self.matched} {noun} matched: changed {self.total_changed}"
        text += f" ({changes})" if changes else ""
        text += f", skipped {self.skipped} (their state did not allow it)"
        if self.gone:
            text += f", {self.gone} no longer matched when reached"
        if self.held:
            text += (
                f"; {self.held} were held by other transactions on every try and are "
                "unchanged: run it again"
            )
        return text + f"; {self.batches} batch(es) in {self.seconds:.1f} s"


class _Tally:
    """The counts of a run as its batches come back."""

    def __init__(self, action: BulkAction, matched: int) -> None:
        self.action = action
        self.matched = matched
        self.changed: Counter[str] = Counter({label: 0 for label in action.outcomes})
        self.done = self.skipped = self.batches = 0
        self.held: list[Any] = []

    def add(self, ids: Sequence[Any], outcome: BatchOutcome, *, retried: bool) -> None:
        if not retried:
            self.done += len(ids)
        self.changed.update(outcome.changed)
        self.skipped += len(ids) - outcome.total - len(outcome.held)
        self.held.extend(outcome.held)
        self.batches += 1

    def progress(self) -> BulkProgress:
        return BulkProgress(
            batch=self.batches,
            matched=self.matched,
            done=self.done,
            changed=dict(self.changed),
            skipped=self.skipped,
            held=len(self.held),
        )


def run_bulk(
    rows: QuerySet[Any],
    action: BulkAction,
    *,
    error: type[Exception],
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH,
    up_to: Any = None,
    on_batch: Callable[[BulkProgress], None] | None = None,
) -> BulkReport:
    """Apply ``action`` to every row of ``rows`` (a filtered QuerySet of the app's
    model), batch after batch; with ``dry_run``, only count (:attr:`BulkAction.preview`).

    ``up_to`` bounds the ids (a dry run's ``up_to``, so that the run acts on what the
    person confirmed); by default the largest id matching now. Each batch commits on
    its own, so this refuses to run inside the caller's transaction: ``error``, as for
    a ``batch_size`` outside 1..:data:`MAX_BATCH`, and nothing is written. A database
    error stops the run and propagates: the batches before it stay done, the failed one
    is rolled back, and running it again goes on (the rows already changed are
    skipped).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise error(f"batch size must be an int, not {type(batch_size).__name__}")
    if not 1 <= batch_size <= MAX_BATCH:
        raise error(f"batch size must be between 1 and {MAX_BATCH}, got {batch_size}")
    connection = connections[alias_for(rows.model)]
    if not dry_run and in_caller_atomic_block(connection):
        raise error(
            f"a bulk {action.verb} commits each batch on its own; it cannot run inside "
            "transaction.atomic() (nor a request with ATOMIC_REQUESTS): use the command"
        )
    started = time.monotonic()
    if up_to is None:
        up_to = rows.aggregate(last=Max("pk"))["last"]
    bounded = rows.filter(pk__lte=up_to) if up_to is not None else rows.none()
    matched = bounded.count()
    if dry_run:
        counts = action.preview(bounded)
        changed = {label: counts.get(label, 0) for label in action.outcomes}
        reasons = {label: n for label, n in counts.items() if label not in action.outcomes}
        return BulkReport(
            verb=action.verb,
            dry_run=True,
            matched=matched,
            up_to=up_to,
            changed=changed,
            skipped=matched - sum(changed.values()),
            reasons=reasons,
            seconds=time.monotonic() - started,
        )
    tally = _Tally(action, matched)
    after = None
    while True:
        page = bounded if after is None else bounded.filter(pk__gt=after)
        ids = list(page.order_by("pk").values_list("pk", flat=True)[:batch_size])
        if not ids:
            break
        after = ids[-1]
        if tally.batches:
            let_writers_in(connection)
        fault_point("ledon.bulk.page", ids=ids, verb=action.verb)
        tally.add(ids, action.apply(ids), retried=False)
        if on_batch is not None:
            on_batch(tally.progress())
    pause = HELD_PAUSE
    for _ in range(HELD_TRIES):
        if not tally.held:
            break
        time.sleep(pause)
        pause *= 2
        again, tally.held = tally.held, []
        for start in range(0, len(again), batch_size):
            chunk = again[start : start + batch_size]
            tally.add(chunk, action.apply(chunk), retried=True)
            if on_batch is not None:
                on_batch(tally.progress())
    return BulkReport(
        verb=action.verb,
        dry_run=False,
        matched=matched,
        up_to=up_to,
        changed=dict(tally.changed),
        skipped=tally.skipped,
        held=len(tally.held),
        gone=max(matched - tally.done, 0),
        batches=tally.batches,
        seconds=time.monotonic() - started,
    )
