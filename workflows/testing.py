"""Helpers for testing your own workflows.

``run_workflows_inline()`` drives every due advance and activity job in the calling
thread, on its database connection (so it also sees what a ``TestCase``'s open
transaction wrote), through the same handlers as ``manage.py run_jobs``.
``run_workflow()`` drives one run until it finishes or waits for something only the
test can give (a signal, with or without a timeout), moving a :class:`TestClock` to
each timer's time so sleeps and retries' back-off take no real time. To test a
signal wait's timeout, move the clock past it (``clock.advance(seconds)``) and call
``run_workflow()`` again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef
from django.utils import timezone

from jobs.models import Job
from jobs.testing import InlineRun, run_jobs_inline
from jobs.types import JobStatus

from . import engine, store, validation
from .exceptions import RunNotFound
from .models import WorkflowRun, WorkflowSignal, WorkflowStep
from .types import RunSnapshot, RunStatus, StepKind, StepStatus


class TestClock:
    """A clock the test moves: ``now`` starts at the real time (or ``start``)."""

    __test__ = False  # not a pytest test class

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or timezone.now()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now

    def move_to(self, when: datetime) -> datetime:
        self.now = max(self.now, when)
        return self.now


@contextmanager
def use_clock(clock: TestClock) -> Iterator[TestClock]:
    """Have the engine record checkpoints at ``clock``'s time."""
    engine.set_clock(clock)
    try:
        yield clock
    finally:
        engine.set_clock(None)


def run_workflows_inline(
    *, clock: TestClock | None = None, max_attempts_run: int = 10_000
) -> list[InlineRun]:
    """Run every due job (advances, activity items, and any other job) in this thread
    until none is due, at ``clock``'s time if given."""
    if clock is None:
        return run_jobs_inline(max_attempts_run=max_attempts_run)
    with use_clock(clock):
        return run_jobs_inline(max_attempts_run=max_attempts_run, now=clock.now)


def run_workflow(
    scope: str, run_id: str, *, clock: TestClock | None = None, max_rounds: int = 1000
) -> RunSnapshot:
    """Drive run ``run_id`` until it finishes or waits for a signal (it or a child
    run of it) or for nothing due: between rounds the clock jumps to the run's next
    timer or retry, never past a signal wait's timeout (move ``clock`` yourself to
    test one). Returns the run's snapshot."""
    scope_hash = validation.scope_hash(scope)
    clock = clock or TestClock()
    for _ in range(max_rounds):
        run_workflows_inline(clock=clock)
        row = WorkflowRun.objects.for_scope(scope_hash).filter(run_id=run_id).first()
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in this scope")
        if row.status in RunStatus.finished() or _waits_for_a_signal(row):
            break
        wake_at = _next_wake(row)
        queued = _next_queued_job()
        if queued is not None and queued > clock.now:
            wake_at = queued if wake_at is None else min(wake_at, queued)
        if wake_at is None or wake_at <= clock.now:
            break
        clock.move_to(wake_at)
    snapshot = store.get(scope_hash, run_id)
    assert snapshot is not None
    return snapshot


def _next_queued_job() -> datetime | None:
    """When the next queued job is due (an activity's retry, say)."""
    return (
        Job.objects.filter(status=JobStatus.QUEUED)
        .order_by("next_run_at")
        .values_list("next_run_at", flat=True)
        .first()
    )


def _waits_for_a_signal(run: WorkflowRun) -> bool:
    """Whether the run, or an unfinished descendant, waits at a signal wait that no
    signal was sent for yet (read from its checkpoints: a signal step still Waiting;
    a signal sent meanwhile has queued the advance that reads it)."""
    runs = [run.pk]
    level = [run.pk]
    while level:
        level = list(
            WorkflowRun.objects.filter(
                parent__in=level, status__in=RunStatus.unfinished()
            ).values_list("pk", flat=True)
        )
        runs += level
    sent = WorkflowSignal.objects.filter(run=OuterRef("run"), key=OuterRef("key"))
    return (
        WorkflowStep.objects.filter(run__in=runs, kind=StepKind.SIGNAL, status=StepStatus.WAITING)
        .exclude(Exists(sent))
        .exists()
    )


def _next_wake(run: WorkflowRun) -> datetime | None:
    """The earliest wake time of the run or any unfinished descendant."""
    times = [run.wake_at] if run.wake_at is not None else []
    for child in WorkflowRun.objects.filter(parent=run, status__in=RunStatus.unfinished()):
        when = _next_wake(child)
        if when is not None:
            times.append(when)
    return min(times) if times else None
