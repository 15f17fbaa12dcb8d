"""Whatever callers do while workers advance runs, every run ends or waits for
something that will wake it: random rounds (Hypothesis stateful testing) of cancel,
signal, timer, fan-in and resume, each against two workers advancing runs at the same
time (threads with their own connections), on SQLite and PostgreSQL.

In each round time may first pass beyond every timer, then the caller's operation runs
beside two workers that run every due job: the advances a timer, a signal, the last
item or a child's end queued, and the items themselves. The operation may be forced
into the middle of an advance: the worker that reaches the chosen fault point (a
checkpoint reached, its cancel check passed, or an advance about to wait; the first or
a later time in the round) stops there until the operation has committed, and the
operation may name the run stopped there. The points lie outside any transaction, so
the operation never waits for the stopped worker. What the operation queues runs in
the next round, beside the next operation.

Whenever every due job has run (a rule of its own, and at the end), the claim holds:
each run is finished, or waits with no cancel pending and with what it waits for on
its way (an advance or item job queued, a child run not finished, or a signal not
yet sent). A run left Running, or Waiting with a cancel nobody will act on, or with
its wake-up lost, fails it.

The short profile runs in the suite; ``LEDON_MODEL_EXAMPLES`` (and
``LEDON_MODEL_STEPS``) runs a longer one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

from jobs.models import Job, JobAttempt
from jobs.testing import run_jobs_inline
from jobs.types import JobStatus
from ledon.faults import add_fault_hook, remove_fault_hook
from tests.conftest import in_own_connection
from workflows import (
    RunStatus,
    StepStatus,
    WorkflowContext,
    WorkflowScope,
    activity,
    engine,
    send_signal,
    start_workflow,
    store,
    workflow,
)
from workflows.exceptions import InvalidTransition, RunNotFound
from workflows.models import WorkflowItem, WorkflowRun, WorkflowSignal, WorkflowStep
from workflows.testing import TestClock

SCOPE = "wf-engine-model"
RUNS = ["r1", "r2"]
#: Whom a caller's operation names: a top-level run or its child, or the run whose
#: advance the round stopped (at the point where its wake-up is being acted on).
PAUSED = "the paused run"
TARGETS = [PAUSED, PAUSED, PAUSED, *RUNS, "r1/kid", "r2/kid"]
SIGNALS = ["go", "kid-go"]
REACHED = "workflows.checkpoint.reached"
SUSPEND = "workflows.advance.suspend"
#: Where an advance may be stopped while the operation commits: (fault point, the
#: checkpoint's key or None for any, which time it is reached in the round), or None
#: (not at all). A checkpoint is reached first when it starts its wait, and again when
#: its timer, signal, last item or child wakes the run.
Where = tuple[str, str | None, int]
PAUSES: list[Where | None] = [
    None,
    # The first checkpoint with work in the round: most often the one whose timer or
    # signal woke its run.
    *[(REACHED, None, 1)] * 3,
    (REACHED, None, 2),
    # The last item's fan-in, a child's end, a signal's wait started.
    (REACHED, "items", 2),
    (REACHED, "kid", 2),
    (REACHED, "go", 1),
    *[(SUSPEND, None, 1)] * 2,
    (SUSPEND, None, 2),
]
EXAMPLES = int(os.environ.get("LEDON_MODEL_EXAMPLES", "20"))
STEPS = int(os.environ.get("LEDON_MODEL_STEPS", "20"))

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(max(300, EXAMPLES * STEPS)),
]

#: Runs whose "check" step fails (until a resume takes them out).
FAILING: set[str] = set()


def check(run_id: str) -> str:
    if run_id in FAILING:
        raise RuntimeError(f"{run_id} is failing")
    return "checked"


@activity("enginemodel.item")
def item(value: int) -> int:
    return value * 10


@workflow("enginemodel.kid", version=1)
def kid(wf: WorkflowContext) -> Any:
    wf.sleep("kid-nap", 30)
    return wf.wait_for_signal("kid-go")


@workflow("enginemodel.flow", version=1)
def flow(wf: WorkflowContext) -> Any:
    wf.sleep("nap", 60)
    values = wf.map("items", item, [1, 2])
    wf.step("check", check, wf.run_id)
    go = wf.wait_for_signal("go")
    return {"values": values, "go": go, "kid": wf.child("kid", "enginemodel.kid")}


class Pause:
    """Stops the advance that reaches ``point`` (at checkpoint ``key``, if given) the
    ``nth`` time until :meth:`go_on`."""

    def __init__(self, point: str, key: str | None, nth: int, reached: threading.Event) -> None:
        self.point = point
        self.key = key
        self.nth = nth
        self.reached = reached
        #: The row id of the run whose advance stopped.
        self.run: int | None = None
        self.released = threading.Event()
        self._seen = 0
        self._lock = threading.Lock()

    def hook(self, name: str, context: dict[str, Any]) -> None:
        if name != self.point or (self.key is not None and context.get("key") != self.key):
            return
        with self._lock:
            self._seen += 1
            if self._seen != self.nth:
                return
        self.run = context["run"]
        self.reached.set()
        assert self.released.wait(60), "the operation never let the advance go on"

    def go_on(self) -> None:
        self.released.set()


class EngineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = TestClock()
        engine.set_clock(self.clock)
        # Two workers and a caller: threads (and their connections) kept for every
        # round of the example, closed at its end.
        self.pool = ThreadPoolExecutor(max_workers=3)

    def teardown(self) -> None:
        try:
            self.settle()
        finally:
            engine.set_clock(None)
            closing = threading.Barrier(3)
            for _ in range(3):
                # One on each thread: none returns before all three have started.
                self.pool.submit(in_own_connection(lambda: closing.wait(60)))
            self.pool.shutdown()

    @initialize(failing=st.sets(st.sampled_from(RUNS)))
    def started(self, failing: set[str]) -> None:
        WorkflowRun.objects.all().delete()
        JobAttempt.objects.all().delete()
        Job.objects.all().delete()
        FAILING.clear()
        FAILING.update(failing)
        for run_id in RUNS:
            assert start_workflow(SCOPE, run_id, "enginemodel.flow").created

    # ------------------------------------------------------------------ rounds

    @rule(run_id=st.sampled_from(TARGETS), later=st.booleans(), pause=st.sampled_from(PAUSES))
    def cancel(self, run_id: str, later: bool, pause: Where | None) -> None:
        def operation(stopped: str | None) -> Any:
            if run_id == PAUSED:
                return WorkflowScope(SCOPE).cancel(stopped or RUNS[0])
            return WorkflowScope(SCOPE).cancel(run_id)

        self._round(operation, later, pause)

    @rule(
        run_id=st.sampled_from(RUNS),
        key=st.sampled_from(SIGNALS),
        later=st.booleans(),
        pause=st.sampled_from(PAUSES),
    )
    def signal(self, run_id: str, key: str, later: bool, pause: Where | None) -> None:
        to = run_id if key == "go" else f"{run_id}/kid"
        self._round(lambda stopped: send_signal(SCOPE, to, key, 1), later, pause)

    @rule(run_id=st.sampled_from(RUNS), later=st.booleans(), pause=st.sampled_from(PAUSES))
    def resume(self, run_id: str, later: bool, pause: Where | None) -> None:
        FAILING.discard(run_id)
        self._round(lambda stopped: WorkflowScope(SCOPE).resume(run_id), later, pause)

    @rule(later=st.booleans(), pause=st.sampled_from(PAUSES))
    def advance(self, later: bool, pause: Where | None) -> None:
        """Only the workers: timers fire, items end and fan in, children wake their
        parents, with no caller beside them."""
        self._round(lambda stopped: None, later, pause)

    def _round(
        self,
        operation: Callable[[str | None], Any],
        later: bool,
        pause: Where | None,
    ) -> None:
        """``operation(stopped)`` beside two workers; ``stopped``: the id of the run
        whose advance stopped at ``pause`` (None if none did)."""
        # Callers write at the real time (a signal's wake-up is due now): the clock
        # never lags behind it. ``later``: past every timer.
        self.clock.move_to(timezone.now())
        if later:
            self.clock.advance(61)
        ready = threading.Event()
        stop = Pause(*pause, ready) if pause is not None else None
        left = [2]
        lock = threading.Lock()

        def worker(n: int) -> None:
            try:
                run_jobs_inline(worker_id=f"w{n}", now=self.clock.now, max_attempts_run=200)
            finally:
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        ready.set()

        def caller() -> None:
            try:
                assert ready.wait(60), "no worker reached the pause or ended"
                stopped = None
                if stop is not None and stop.run is not None:
                    stopped = WorkflowRun.objects.get(pk=stop.run).run_id
                # No such child yet, or a run that has not failed: nothing to do.
                with contextlib.suppress(RunNotFound, InvalidTransition):
                    operation(stopped)
            finally:
                if stop is not None:
                    stop.go_on()

        if stop is not None:
            add_fault_hook(stop.hook)
        try:
            futures = [self.pool.submit(lambda n=n: worker(n)) for n in (1, 2)]
            futures.append(self.pool.submit(caller))
            for future in futures:
                future.result(timeout=120)
        finally:
            if stop is not None:
                remove_fault_hook(stop.hook)

    # ------------------------------------------------------------------ the claim

    @rule()
    def settle(self) -> None:
        """Every due job runs to its end; then each run ends, or waits for something
        on its way."""
        self.clock.move_to(timezone.now())
        run_jobs_inline(worker_id="settle", now=self.clock.now)
        for run in WorkflowRun.objects.order_by("id"):
            where = f"run {run.run_id}: {run.status} {run.wait_kind} {run.wait_key!r}"
            assert run.status != RunStatus.RUNNING, f"{where}: left Running"
            if run.status in RunStatus.finished():
                assert run.driver_token is None, where
                if run.status == RunStatus.CANCELLED:
                    self._nothing_left_open(run, where)
                continue
            assert not run.cancel_requested, f"{where}: waits with a cancel pending"
            assert self._on_its_way(run), f"{where}: nothing will wake it"

    def _on_its_way(self, run: WorkflowRun) -> bool:
        advance_queued = Job.objects.filter(
            scope_hash=store.advance_scope_hash(),
            job_id__startswith=f"{store.advance_job_prefix(run.pk)}{run.generation}:",
            status=JobStatus.QUEUED,
        ).exists()
        if advance_queued:
            return True
        waits = WorkflowStep.objects.filter(
            run=run, status__in=(StepStatus.WAITING, StepStatus.RUNNING)
        )
        for step in waits:
            if step.kind == "signal" and (run.wait_kind, run.wait_key) == ("signal", step.key):
                # Only a signal not sent yet is on its way: a sent one had to wake it.
                return not WorkflowSignal.objects.filter(run=run, key=step.key).exists()
            if step.kind == "child" and step.child is not None:
                return step.child.status in RunStatus.unfinished()
            if WorkflowItem.objects.filter(step=step, status=StepStatus.RUNNING).exists():
                return Job.objects.filter(
                    scope_hash=run.scope_hash,
                    job_id__in=WorkflowItem.objects.filter(step=step).values("job_id"),
                    status__in=(JobStatus.QUEUED, JobStatus.RUNNING),
                ).exists()
        return False

    def _nothing_left_open(self, run: WorkflowRun, where: str) -> None:
        open_steps = WorkflowStep.objects.filter(
            run=run, status__in=(StepStatus.WAITING, StepStatus.RUNNING)
        )
        assert not open_steps.exists(), f"{where}: checkpoints left open"
        assert not WorkflowItem.objects.filter(step__run=run, status=StepStatus.RUNNING).exists(), (
            f"{where}: items left running"
        )
        children = WorkflowRun.objects.filter(parent=run, status__in=RunStatus.unfinished())
        assert not children.exists(), f"{where}: children left unfinished"


def test_every_run_ends_or_waits_for_something_on_its_way() -> None:
    run_state_machine_as_test(
        EngineModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
            # Each round starts threads and runs jobs: shrinking a failure would take
            # longer than finding it, and the unshrunk rounds already tell the story.
            phases=[Phase.explicit, Phase.generate],
        ),
    )
