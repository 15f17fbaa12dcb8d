"""The workflow run store against a model: random sequences of every transition of a
run — start (with a deadline or not), take (by advance jobs and directly), fenced
checkpoint writes by the current and by stale drivers, suspend, signals, cancel, a
deadline's time-out, finish, resume, release and fork — checked against a
plain-Python model of the lifecycle after every step (Hypothesis stateful testing),
on SQLite and PostgreSQL.

Callers' operations go through the public API (start, signal, cancel, resume); the
driver's go through the store exactly as the engine calls it. No worker runs: the
advance jobs the store stages to wake runs are only counted, never run.

The short profile runs in the suite (a few seconds); ``LEDON_MODEL_EXAMPLES=500``
(and ``LEDON_MODEL_STEPS``) runs a long one.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from jobs.models import Job, JobAttempt
from workflows import (
    CancelOutcome,
    RunStatus,
    SignalOutcome,
    StepKind,
    StepStatus,
    WorkflowContext,
    WorkflowScope,
    send_signal,
    start_workflow,
    store,
    validation,
    workflow,
)
from workflows.exceptions import (
    InvalidTransition,
    RunExists,
    RunNotFound,
    SignalConflict,
    StepNotFound,
    WorkflowIdentityConflict,
)
from workflows.models import WorkflowRun, WorkflowSignal, WorkflowStep
from workflows.types import Wait, WaitKind

SCOPE = "wf-model"
NAME = "model.run"
RUN_IDS = ["r1", "r2"]
#: Which driver of a run a driver's rule acts as: the last one taken (the current one
#: while the run is Running) or an earlier, stale one.
DRIVERS = ["last", "last", "earlier"]
#: Advance jobs of the model: a take names one of these (or none, as an operator).
JOBS = ["a", "b", None]
KEYS = ["k1", "k2", "k3"]
SIGNALS = ["s1", "s2"]
WAITS = [
    Wait(kind=WaitKind.SIGNAL, key="s1"),
    Wait(kind=WaitKind.SIGNAL, key="s2"),
    Wait(kind=WaitKind.TIMER, key="nap"),
]
#: What a recorded checkpoint can be: (kind, status) as the engine inserts them.
CHECKPOINTS = [
    (StepKind.STEP, StepStatus.SUCCEEDED),
    (StepKind.STEP, StepStatus.FAILED),
    (StepKind.STEP, StepStatus.WAITING),
    (StepKind.SIGNAL, StepStatus.WAITING),
    (StepKind.PATCH, StepStatus.SUCCEEDED),
]
#: Where a fork may go: a new run id, or one that is taken.
FORK_IDS = ["f1", "r1"]
ENDS = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED]
#: The runs started with a deadline, and its seconds.
TIMEOUTS = {"r2": 3600}
EXAMPLES = int(os.environ.get("LEDON_MODEL_EXAMPLES", "10"))
STEPS = int(os.environ.get("LEDON_MODEL_STEPS", "50"))

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(max(120, EXAMPLES * STEPS // 2)),
]


@workflow(NAME, version=1)
def never_runs(wf: WorkflowContext) -> None:
    """The model's runs are driven by hand: no worker replays this body."""
    raise AssertionError("the model drives its runs through the store")


def job_id(run_id: str, job: str | None) -> str | None:
    return None if job is None else f"model:{run_id}:{job}"


@dataclass
class ModelRun:
    pk: int
    input: int
    status: RunStatus = RunStatus.WAITING
    token: str | None = None
    driver_job: str | None = None
    wake_pending: bool = False
    cancel: bool = False
    generation: int = 0
    advances: int = 0
    #: What it waits for: (kind, key).
    wait: tuple[str, str] = ("start", "")
    failed_step: str = ""
    #: The keys the last resume erased, in the order recorded.
    rerun: list[str] = field(default_factory=list)
    #: Recorded checkpoints: key -> (kind, status), in the order recorded.
    steps: dict[str, tuple[StepKind, StepStatus]] = field(default_factory=dict)
    #: Signals sent: key -> payload.
    signals: dict[str, int] = field(default_factory=dict)
    #: Advance jobs staged to wake the run: (generation, reason, detail).
    wakes: set[tuple[int, str, str]] = field(default_factory=set)
    #: Every driver that took the run, oldest first.
    drivers: list[store.Driver] = field(default_factory=list)
    #: Its deadline (None: none), and whether it ended timed out.
    deadline: datetime | None = None
    timed_out: bool = False

    @property
    def finished(self) -> bool:
        return self.status in RunStatus.finished()

    def holds(self, token: str) -> bool:
        return self.status == RunStatus.RUNNING and self.token == token

    def cancel_open_checkpoints(self) -> None:
        for key, (kind, status) in self.steps.items():
            if status in (StepStatus.RUNNING, StepStatus.WAITING):
                self.steps[key] = (kind, StepStatus.CANCELLED)

    def wake(self, reason: str, detail: str = "") -> None:
        self.wakes.add((self.generation, reason, detail))

    def cancelled(self, outcome: CancelOutcome) -> None:
        """A cancel (or a deadline's time-out) that said ``outcome``: a waiting run
        ends at once, a running one is asked to stop."""
        if self.status == RunStatus.WAITING:
            assert outcome is CancelOutcome.CANCELLED
            self.status, self.cancel, self.token, self.wait = (
                RunStatus.CANCELLED,
                True,
                None,
                ("", ""),
            )
            self.cancel_open_checkpoints()
        elif self.status == RunStatus.RUNNING:
            assert outcome is CancelOutcome.REQUESTED
            self.cancel = True
            self.cancel_open_checkpoints()
        else:
            assert outcome is CancelOutcome.ALREADY_FINISHED


class RunStoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.runs: dict[str, ModelRun] = {}
        self.scope_hash = validation.scope_hash(SCOPE)

    @initialize()
    def empty_store(self) -> None:
        WorkflowRun.objects.all().delete()
        JobAttempt.objects.all().delete()
        Job.objects.all().delete()
        for run_id in RUN_IDS:
            snapshot = start_workflow(SCOPE, run_id, NAME, 1, timeout=TIMEOUTS.get(run_id))
            assert snapshot.created
            assert snapshot.status == RunStatus.WAITING
            pk = WorkflowRun.objects.get(scope_hash=self.scope_hash, run_id=run_id).pk
            self.runs[run_id] = ModelRun(pk, 1)
            self.runs[run_id].wake("start")
            if run_id in TIMEOUTS:
                seconds = timedelta(seconds=TIMEOUTS[run_id])
                self.runs[run_id].deadline = snapshot.created_at + seconds
                self.runs[run_id].wake("deadline")

    @rule(operation=st.sampled_from(["signal", "cancel", "resume"]))
    def unknown_run(self, operation: str) -> None:
        """A run id this scope never started is not found, whatever the operation."""
        scope = WorkflowScope(SCOPE)
        call: Callable[[], object] = {
            "signal": lambda: send_signal(SCOPE, "unknown", "s1", 1),
            "cancel": lambda: scope.cancel("unknown"),
            "resume": lambda: scope.resume("unknown"),
        }[operation]
        with pytest.raises(RunNotFound):
            call()

    # ------------------------------------------------------------------ callers

    @rule(run_id=st.sampled_from(RUN_IDS), value=st.sampled_from([1, 2]))
    def start_again(self, run_id: str, value: int) -> None:
        """The same request is the same run; other input for its id is a conflict."""
        run = self.runs[run_id]
        try:
            snapshot = start_workflow(SCOPE, run_id, NAME, value)
        except WorkflowIdentityConflict:
            assert run.input != value
            return
        assert run.input == value
        assert not snapshot.created
        assert snapshot.status == run.status

    @rule(
        run_id=st.sampled_from(RUN_IDS),
        key=st.sampled_from(SIGNALS),
        payload=st.sampled_from([1, 2]),
    )
    def signal(self, run_id: str, key: str, payload: int) -> None:
        run = self.runs.get(run_id)
        try:
            outcome = send_signal(SCOPE, run_id, key, payload)
        except RunNotFound:
            assert run is None
            return
        except SignalConflict:
            assert run is not None
            assert run.signals.get(key) not in (None, payload)
            return
        assert run is not None
        if key in run.signals:
            assert run.signals[key] == payload
            assert outcome is SignalOutcome.ALREADY_SENT
        elif run.finished:
            assert outcome is SignalOutcome.RUN_FINISHED
        else:
            assert outcome is SignalOutcome.DELIVERED
            run.signals[key] = payload
            if run.status == RunStatus.RUNNING:
                run.wake_pending = True
            elif run.wait == ("signal", key):
                run.wake("signal", key)

    @rule(run_id=st.sampled_from(RUN_IDS))
    def cancel(self, run_id: str) -> None:
        run = self.runs.get(run_id)
        try:
            outcome = WorkflowScope(SCOPE).cancel(run_id)
        except RunNotFound:
            assert run is None
            return
        assert run is not None
        run.cancelled(outcome)

    @rule(run_id=st.sampled_from(RUN_IDS), passed=st.booleans())
    def time_out(self, run_id: str, passed: bool) -> None:
        """A deadline's advance job, run before or after the deadline: past it, a
        cancel that keeps ``RunTimedOut`` on a run that ends at once."""
        run = self.runs[run_id]
        at = (run.deadline or timezone.now()) + timedelta(seconds=1 if passed else -1)
        outcome = store.time_out(run.pk, at)
        if run.deadline is None or not passed:
            assert outcome is None
            return
        assert outcome is not None
        if run.status == RunStatus.WAITING:
            run.timed_out = True  # it ends now, keeping RunTimedOut
        run.cancelled(outcome)

    @rule(run_id=st.sampled_from(RUN_IDS))
    def resume(self, run_id: str) -> None:
        run = self.runs.get(run_id)
        try:
            snapshot = WorkflowScope(SCOPE).resume(run_id)
        except RunNotFound:
            assert run is None
            return
        except InvalidTransition:
            assert run is not None
            assert run.status != RunStatus.FAILED
            return
        assert run is not None
        assert run.status == RunStatus.FAILED
        run.status, run.cancel, run.failed_step = RunStatus.WAITING, False, ""
        run.generation += 1
        run.wait = ("resume", "")
        # Failed checkpoints and inline steps waiting for a retry are tried again,
        # recorded again where they stood.
        erased = [
            key
            for key, (kind, status) in run.steps.items()
            if status == StepStatus.FAILED
            or (kind == StepKind.STEP and status == StepStatus.WAITING)
        ]
        run.rerun = erased
        run.steps = {key: step for key, step in run.steps.items() if key not in erased}
        run.wake("resume")
        if run.deadline is not None:
            run.wake("deadline")
        assert snapshot.status == RunStatus.WAITING
        assert {step.key for step in snapshot.steps} == set(run.steps)

    @rule(run_id=st.sampled_from(RUN_IDS), new_run_id=st.sampled_from(FORK_IDS), data=st.data())
    def fork(self, run_id: str, new_run_id: str, data: st.DataObject) -> None:
        source = self.runs[run_id]
        # Mostly a step the run recorded (a fork that copies something), or not.
        from_step = data.draw(st.sampled_from([*source.steps, *source.steps, "never"]))
        try:
            snapshot = WorkflowScope(SCOPE).fork(run_id, new_run_id, from_step=from_step)
        except InvalidTransition:
            assert source.status == RunStatus.RUNNING
            return
        except StepNotFound:
            assert source.status != RunStatus.RUNNING
            assert from_step not in source.steps
            return
        except RunExists:
            assert source.status != RunStatus.RUNNING
            assert from_step in source.steps
            assert new_run_id in self.runs
            return
        assert source.status != RunStatus.RUNNING
        assert new_run_id not in self.runs
        keys = list(source.steps)
        before = keys[: keys.index(from_step)]
        finished = (StepStatus.SUCCEEDED, StepStatus.FAILED)
        copied = {key: source.steps[key] for key in before if source.steps[key][1] in finished}
        left_out = [key for key in before if key not in copied]
        rerun = left_out + [key for key in source.rerun if key not in before]
        pk = WorkflowRun.objects.get(scope_hash=self.scope_hash, run_id=new_run_id).pk
        forked = ModelRun(pk, source.input, rerun=rerun, steps=copied)
        forked.wake("start")
        self.runs[new_run_id] = forked
        assert snapshot.status == RunStatus.WAITING
        assert [step.key for step in snapshot.steps] == list(copied)

    # ------------------------------------------------------------------ the engine

    @rule(run_id=st.sampled_from(RUN_IDS), job=st.sampled_from(JOBS))
    def take(self, run_id: str, job: str | None) -> None:
        run = self.runs[run_id]
        by = job_id(run_id, job)
        driver = store.take(run.pk, by)
        takeable = run.status == RunStatus.WAITING or (
            run.status == RunStatus.RUNNING and (by is None or by == run.driver_job)
        )
        if not takeable:
            assert driver is None
            if run.status == RunStatus.RUNNING:
                # The live driver replays once more before it waits.
                run.wake_pending = True
            return
        assert driver is not None
        assert driver.token != run.token
        run.status, run.token, run.driver_job = RunStatus.RUNNING, driver.token, by
        run.wake_pending = False
        run.advances += 1
        run.drivers.append(driver)

    @rule(
        run_id=st.sampled_from(RUN_IDS),
        which=st.sampled_from(DRIVERS),
        key=st.sampled_from(KEYS),
        checkpoint=st.sampled_from(CHECKPOINTS),
    )
    def record(
        self, run_id: str, which: str, key: str, checkpoint: tuple[StepKind, StepStatus]
    ) -> None:
        driver = self._driver(run_id, which)
        if driver is None:
            return
        run = self._holder(driver)
        kind, status = checkpoint
        now = timezone.now()
        try:
            with transaction.atomic(using=store.alias()):
                store.guard(driver, now)
                store.insert_step(
                    driver,
                    key,
                    kind,
                    status,
                    now,
                    result_json="1" if status == StepStatus.SUCCEEDED else None,
                )
        except store.StaleDriver:
            assert run is None  # a stale driver records nothing
            return
        except IntegrityError:
            assert run is not None
            assert key in run.steps
            return
        assert run is not None
        assert key not in run.steps
        run.steps[key] = (kind, status)

    @rule(
        run_id=st.sampled_from(RUN_IDS), which=st.sampled_from(DRIVERS), key=st.sampled_from(KEYS)
    )
    def complete_checkpoint(self, run_id: str, which: str, key: str) -> None:
        """A waiting checkpoint is recorded Succeeded (a signal arrived, a child ended)."""
        driver = self._driver(run_id, which)
        if driver is None:
            return
        run = self._holder(driver)
        now = timezone.now()
        try:
            with transaction.atomic(using=store.alias()):
                store.guard(driver, now)
                step = store.load_steps(driver.run.pk).get(key)
                changed = (
                    step is not None
                    and store.update_step(
                        step,
                        StepStatus.WAITING,
                        status=StepStatus.SUCCEEDED,
                        result_json="2",
                        finished_at=now,
                    )
                    is not None
                )
        except store.StaleDriver:
            assert run is None
            return
        assert run is not None
        recorded = run.steps.get(key)
        assert changed == (recorded is not None and recorded[1] == StepStatus.WAITING)
        if changed:
            assert recorded is not None
            run.steps[key] = (recorded[0], StepStatus.SUCCEEDED)

    @rule(
        run_id=st.sampled_from(RUN_IDS),
        which=st.sampled_from(DRIVERS),
        wait=st.sampled_from(WAITS),
    )
    def suspend(self, run_id: str, which: str, wait: Wait) -> None:
        driver = self._driver(run_id, which)
        if driver is None:
            return
        run = self._holder(driver)
        outcome = store.suspend(driver, wait, timezone.now())
        if run is None:
            assert outcome is store.Suspended.STALE
        elif run.cancel:
            # A cancelled run never waits: its driver ends it (see finish).
            assert outcome is store.Suspended.CANCEL_REQUESTED
        elif run.wake_pending:
            assert outcome is store.Suspended.WAKE_PENDING
            run.wake_pending = False
        else:
            assert outcome is store.Suspended.WAITING
            run.status, run.token, run.driver_job = RunStatus.WAITING, None, None
            run.wait = (wait.kind, wait.key)

    @rule(
        run_id=st.sampled_from(RUN_IDS),
        which=st.sampled_from(DRIVERS),
        status=st.sampled_from(ENDS),
    )
    def finish(self, run_id: str, which: str, status: RunStatus) -> None:
        driver = self._driver(run_id, which)
        if driver is None:
            return
        run = self._holder(driver)
        failed_step = "k1" if status == RunStatus.FAILED else ""
        done = store.finish(
            driver,
            status,
            timezone.now(),
            output_json="3" if status == RunStatus.SUCCEEDED else None,
            error="boom" if status == RunStatus.FAILED else "",
            failed_step=failed_step,
        )
        assert done == (run is not None)
        if run is None:
            return
        run.status, run.token, run.driver_job = status, None, None
        run.wait, run.failed_step = ("", ""), failed_step
        if status == RunStatus.CANCELLED:
            run.cancel_open_checkpoints()

    @rule(run_id=st.sampled_from(RUN_IDS), job=st.sampled_from(["a", "b"]))
    def release(self, run_id: str, job: str) -> None:
        """The advance job ``job`` failed for good: its run waits for a new one."""
        by = job_id(run_id, job)
        assert by is not None
        released = store.release(store.advance_scope_hash(), by, timezone.now())
        run = self.runs.get(run_id)
        expected = run is not None and run.status == RunStatus.RUNNING and run.driver_job == by
        assert released == expected
        if run is None or not expected:
            return
        run.status, run.token, run.driver_job = RunStatus.WAITING, None, None
        run.wake_pending = False
        run.wait = ("advance", "")
        run.wake("released", f"{by}@{run.advances}")

    # ------------------------------------------------------------------ checks

    @invariant()
    def the_store_matches_the_model(self) -> None:
        rows = {run.run_id: run for run in WorkflowRun.objects.filter(scope_hash=self.scope_hash)}
        assert set(rows) == set(self.runs)
        for run_id, model in self.runs.items():
            row = rows[run_id]
            where = f"run {run_id}: {model}"
            assert row.pk == model.pk, where
            assert row.status == model.status, where
            assert row.driver_token == model.token, where
            assert row.driver_job == model.driver_job, where
            assert row.wake_pending == model.wake_pending, where
            assert row.cancel_requested == model.cancel, where
            assert row.generation == model.generation, where
            assert row.advances == model.advances, where
            assert (row.wait_kind, row.wait_key) == model.wait, where
            assert row.failed_step == model.failed_step, where
            assert row.rerun_keys == model.rerun, where
            assert (row.finished_at is not None) == model.finished, where
            assert row.deadline == model.deadline, where
            assert row.error.startswith("RunTimedOut: ") == model.timed_out, where
            steps = {
                step.key: (step.kind, step.status) for step in WorkflowStep.objects.filter(run=row)
            }
            assert steps == model.steps, where
            signals = {
                signal.key: validation.from_json(signal.payload_json)
                for signal in WorkflowSignal.objects.filter(run=row)
            }
            assert signals == model.signals, where
        self._the_wake_ups_match()

    def _the_wake_ups_match(self) -> None:
        """One advance job per reason a run was woken for (its id without the digest
        of what woke it: the run, its generation and the reason)."""
        staged: Counter[str] = Counter(
            ":".join(job.split(":")[:3])
            for job in Job.objects.filter(scope_hash=store.advance_scope_hash()).values_list(
                "job_id", flat=True
            )
        )
        expected: Counter[str] = Counter(
            f"wf:{run.pk}.{generation}:{reason}"
            for run in self.runs.values()
            for generation, reason, _ in run.wakes
        )
        assert staged == expected

    # ------------------------------------------------------------------ helpers

    def _driver(self, run_id: str, which: str) -> store.Driver | None:
        """The run's last driver, or its first one (stale once another took the run;
        the same as the last if only one did)."""
        drivers = self.runs[run_id].drivers
        if not drivers:
            return None
        return drivers[-1] if which == "last" else drivers[0]

    def _holder(self, driver: store.Driver) -> ModelRun | None:
        """The run ``driver`` still holds (None: it is stale)."""
        run = self.runs.get(driver.run.run_id)
        return run if run is not None and run.holds(driver.token) else None


def test_the_run_store_follows_its_model() -> None:
    run_state_machine_as_test(
        RunStoreModel,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        ),
    )
