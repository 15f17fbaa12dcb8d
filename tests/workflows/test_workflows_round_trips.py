"""What an advance costs the database: an inline step that writes nothing is its cancel
read and one fenced statement, a step that writes commits its rows with its checkpoint,
and the reads a replay makes of its recorded checkpoints keep every rule of the replay.
A worker without a run's version gives the run back as it stood."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from jobs.models import Job
from jobs.types import JobStatus
from testproject.workflow_checks.models import Effect
from tests.conftest import is_postgres
from workflows import (
    RunStatus,
    StepStatus,
    WorkflowContext,
    WorkflowScope,
    registry,
    send_signal,
    start_workflow,
    store,
    validation,
    workflow,
)
from workflows.engine import VersionMissing, advance
from workflows.exceptions import InvalidInput, NonDeterministicWorkflow
from workflows.models import WorkflowRun, WorkflowStep
from workflows.testing import run_workflows_inline
from workflows.types import SignalOutcome, StepKind

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-trips"


def nothing(n: int) -> int:
    return n


@workflow("trips.steps", version=1)
def steps(wf: WorkflowContext) -> int:
    for index in range(wf.input["steps"]):
        wf.step(f"s{index}", nothing, index)
    return int(wf.input["steps"])


@workflow("trips.twice", version=1)
def twice(wf: WorkflowContext) -> Any:
    wf.step("first", nothing, 1)
    wf.wait_for_signal("go")
    wf.step("first", nothing, 1)
    return "done"


#: The kind of checkpoint "trips.kinds" reaches its first key as, this time.
FIRST = {"kind": "now"}


@workflow("trips.kinds", version=1)
def kinds(wf: WorkflowContext) -> Any:
    if FIRST["kind"] == "now":
        wf.now("first")
    else:
        wf.step("first", nothing, 1)
    wf.wait_for_signal("go")
    return "done"


@workflow("trips.wait", version=1)
def wait(wf: WorkflowContext) -> Any:
    return wf.step("after", nothing, wf.wait_for_signal("go")["n"])


def statements(queries: CaptureQueriesContext) -> list[str]:
    """The statements sent, without the transaction's own (which a transaction that
    ran nothing never sends)."""
    control = ("BEGIN", "COMMIT", "SAVEPOINT", "RELEASE SAVEPOINT", "ROLLBACK")
    return [q["sql"] for q in queries.captured_queries if not q["sql"].startswith(control)]


def test_an_inline_step_that_writes_nothing_is_its_cancel_read_and_one_fenced_write():
    start_workflow(SCOPE, "warm", "trips.steps", {"steps": 1})
    run_workflows_inline()
    start_workflow(SCOPE, "ten", "trips.steps", {"steps": 10})
    with CaptureQueriesContext(connection) as ten:
        run_workflows_inline()
    start_workflow(SCOPE, "twenty", "trips.steps", {"steps": 20})
    with CaptureQueriesContext(connection) as twenty:
        run_workflows_inline()
    assert WorkflowScope(SCOPE).get("twenty").status == RunStatus.SUCCEEDED  # type: ignore[union-attr]
    # Ten more steps, the same advance around them.
    per_step = (len(statements(twenty)) - len(statements(ten))) / 10
    # PostgreSQL: the fence and the checkpoint are one statement; SQLite: two, under
    # its one write lock.
    assert per_step == (2 if is_postgres() else 3)
    writes = [sql for sql in statements(twenty) if "workflowstep" in sql and "INSERT" in sql]
    assert len(writes) == 20
    if is_postgres():
        assert all(sql.startswith("WITH fence AS (UPDATE") for sql in writes)


def advance_after_signal(run_id: str, n: int) -> list[str]:
    """Start a "trips.wait" run, signal it ``n``, and return the statements of the
    advance that ends it (its output checked to be ``n``)."""
    start_workflow(SCOPE, run_id, "trips.wait")
    run_workflows_inline()
    assert send_signal(SCOPE, run_id, "go", {"n": n}) == SignalOutcome.DELIVERED
    with CaptureQueriesContext(connection) as advance:
        run_workflows_inline()
    assert WorkflowScope(SCOPE).get(run_id).output == n  # type: ignore[union-attr]
    return statements(advance)


def test_what_a_replay_reads_again_commits_unflushed_and_a_steps_result_durably(
    pg_only: None,
) -> None:
    """PostgreSQL: after a signal, the take of the run and the signal's checkpoint —
    a crash of the server that took them back would leave the replay to take the run
    and read the signal's durable row again — commit without waiting for the disk;
    the step after it, whose result only the run holds, commits durably."""
    sent = advance_after_signal("unflushed", 4)
    take = [sql for sql in sent if sql.startswith("UPDATE") and 'SET "status" = CASE' in sql]
    signal = [sql for sql in sent if sql.startswith("WITH fence") and 'workflowstep" SET' in sql]
    step = [sql for sql in sent if sql.startswith("WITH fence") and "INSERT" in sql]
    assert (len(take), len(signal), len(step)) == (1, 1, 1), [q[:80] for q in sent]
    unflushed = "set_config('synchronous_commit', 'off', true)"
    assert unflushed in take[0]
    assert unflushed in signal[0]
    assert unflushed not in step[0]
    assert not [sql for sql in sent if unflushed in sql and sql not in take + signal]


def test_the_wait_for_a_signal_reads_it_with_the_take_of_its_run():
    """From a signal's send to the step after its wait, the advance reads the signal
    (and the run's cancel flag) once, in the statement that takes the run: no read
    of its own at the wait."""
    sent = advance_after_signal("read-once", 6)
    read = [sql for sql in sent if "workflowsignal" in sql]
    assert len(read) == 1, [sql[:80] for sql in read]
    assert read[0].startswith("UPDATE")
    assert 'SET "status" = CASE' in read[0]
    # The step after the wait still reads the cancel flag before it works.
    cancel_reads = [sql for sql in sent if sql.startswith('SELECT "cancel_requested"')]
    assert len(cancel_reads) == 1


#: Called by "trips.cancel_between" between its replayed step and its wait.
BETWEEN: list[Any] = []


@workflow("trips.cancel_between", version=1)
def cancel_between(wf: WorkflowContext) -> Any:
    wf.step("first", nothing, 1)
    for call in BETWEEN:
        call()
    payload = wf.wait_for_signal("go")
    return wf.step("after", record_after, payload["n"])


AFTER_RAN: list[int] = []


def record_after(n: int) -> int:
    AFTER_RAN.append(n)
    return n


def test_a_cancel_after_the_take_read_the_signal_still_stops_the_step_after_it():
    """The take reads the signal and the cancel flag before the body runs; a cancel
    that lands after that read (here, from the body before its wait) is read again at
    the next checkpoint with work to do: the step after the wait never runs."""
    AFTER_RAN.clear()
    start_workflow(SCOPE, "between", "trips.cancel_between")
    run_workflows_inline()
    assert send_signal(SCOPE, "between", "go", {"n": 1}) == SignalOutcome.DELIVERED
    BETWEEN.append(lambda: WorkflowScope(SCOPE).cancel("between"))
    try:
        run_workflows_inline()
    finally:
        BETWEEN.clear()
    snap = WorkflowScope(SCOPE).get("between")
    assert snap is not None
    assert snap.status == RunStatus.CANCELLED
    assert AFTER_RAN == []
    assert snap.step("after") is None


def test_a_signal_the_take_found_missing_but_sent_before_the_wait_is_not_lost():
    """A signal sent after the take read it as not sent (here, from the body before
    its wait) finds the run Running and leaves it a wake-up: the driver replays once
    more, reads it, and the run goes on."""
    AFTER_RAN.clear()
    start_workflow(SCOPE, "late", "trips.cancel_between")
    run_workflows_inline()
    pk = WorkflowRun.objects.get(run_id="late").pk
    BETWEEN.append(lambda: send_signal(SCOPE, "late", "go", {"n": 3}))
    try:
        with transaction.atomic():
            store.wake(pk, 0, "test", "late")
        run_workflows_inline()
    finally:
        BETWEEN.clear()
    snap = WorkflowScope(SCOPE).get("late")
    assert snap is not None
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == 3
    assert AFTER_RAN == [3]


def test_an_inline_step_that_writes_commits_its_rows_with_its_checkpoint():
    start_workflow(SCOPE, "effects", "checks.linear", {"start": 5})
    run_workflows_inline()
    snap = WorkflowScope(SCOPE).get("effects")
    assert snap is not None
    assert snap.output == {"a": 5, "b": 6}
    assert sorted(Effect.objects.filter(run_id="effects").values_list("key", flat=True)) == [
        "a",
        "b",
    ]


#: What the on_commit callback of "trips.callback"'s step saw when it ran.
CALLBACK_SAW: list[bool] = []


def register_callback(run_id: str) -> str:
    """A step that writes nothing but leaves a callback for its commit."""

    def committed() -> None:
        recorded = WorkflowStep.objects.filter(run__run_id=run_id, key="callback").exists()
        CALLBACK_SAW.append(recorded)

    transaction.on_commit(committed)
    return "registered"


@workflow("trips.callback", version=1)
def callback(wf: WorkflowContext) -> Any:
    return wf.step("callback", register_callback, wf.run_id)


def test_a_step_callback_runs_once_its_checkpoint_has_committed():
    CALLBACK_SAW.clear()
    start_workflow(SCOPE, "callback", "trips.callback")
    run_workflows_inline()
    snap = WorkflowScope(SCOPE).get("callback")
    assert snap is not None
    assert snap.output == "registered"
    assert CALLBACK_SAW == [True]


def test_a_stale_driver_records_no_checkpoint_in_its_one_statement():
    start_workflow(SCOPE, "stale", "trips.steps", {"steps": 1})
    pk = WorkflowRun.objects.get(run_id="stale").pk
    driver = store.take(pk)
    assert driver is not None
    assert store.take(pk) is not None  # another driver takes it over
    now = store.current_time()
    recorded = store.record_step(driver, None, "s0", StepKind.STEP, StepStatus.SUCCEEDED, now)
    assert recorded is None
    assert not WorkflowScope(SCOPE).get("stale").steps  # type: ignore[union-attr]


def test_a_recorded_key_reached_twice_on_replay_is_nondeterministic():
    start_workflow(SCOPE, "twice", "trips.twice")
    run_workflows_inline()
    send_signal(SCOPE, "twice", "go", {})
    run_workflows_inline()
    snap = WorkflowScope(SCOPE).get("twice")
    assert snap is not None
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "first"
    assert snap.error.startswith(NonDeterministicWorkflow.__name__)
    assert "used twice" in snap.error


@pytest.mark.parametrize(("recorded", "reached"), [("now", "step"), ("step", "now")])
def test_a_recorded_key_reached_as_another_kind_on_replay_is_nondeterministic(
    recorded: str, reached: str
) -> None:
    """A checkpoint reached on replay as another kind fails the run naming both. A
    Succeeded inline step is read for a replay by its first fields alone: reached as
    another kind, it is read whole."""
    run_id = f"kind-{recorded}"
    FIRST["kind"] = recorded
    try:
        start_workflow(SCOPE, run_id, "trips.kinds")
        run_workflows_inline()
        FIRST["kind"] = reached  # the replay reaches the recorded key as another kind
        send_signal(SCOPE, run_id, "go", {})
        run_workflows_inline()
    finally:
        FIRST["kind"] = "now"
    snap = WorkflowScope(SCOPE).get(run_id)
    assert snap is not None
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "first"
    assert f"recorded as a {recorded} checkpoint, reached now as a {reached}" in snap.error


def test_a_replay_reads_whole_rows_only_of_checkpoints_that_are_no_passed_step():
    """The advance's read of a run's checkpoints: every field of those that are no
    Succeeded inline step, the first fields (up to the result) of the others."""
    start_workflow(SCOPE, "whole", "trips.cancel_between")
    run_workflows_inline()
    send_signal(SCOPE, "whole", "go", {"n": 2})
    with CaptureQueriesContext(connection) as advance:
        run_workflows_inline()
    assert WorkflowScope(SCOPE).get("whole").output == 2  # type: ignore[union-attr]
    reads = [
        read
        for sql in statements(advance)
        for read in sql.split("; ")
        if read.startswith("SELECT") and 'FROM "workflows_workflowstep"' in read
    ]
    whole = [read for read in reads if '"error_type"' in read]
    short = [read for read in reads if '"error_type"' not in read and '"result_json"' in read]
    assert len(whole) == 1, reads
    assert len(short) == 1, reads
    assert 'AND NOT ("kind" = ' in whole[0]


def test_a_replayed_step_still_refuses_bad_retries():
    @workflow("trips.retries", version=1)
    def bad_retries(wf: WorkflowContext) -> Any:
        wf.step("a", nothing, 1)
        wf.wait_for_signal("go")
        return wf.step("a2", nothing, 2, retries=wf.input["retries"])

    try:
        start_workflow(SCOPE, "retries", "trips.retries", {"retries": -1})
        run_workflows_inline()
        snap = WorkflowScope(SCOPE).get("retries")
        assert snap is not None
        assert snap.status == RunStatus.WAITING
        send_signal(SCOPE, "retries", "go", {})
        run_workflows_inline()
        snap = WorkflowScope(SCOPE).get("retries")
        assert snap is not None
        assert snap.status == RunStatus.FAILED
        assert snap.error.startswith(InvalidInput.__name__)
        assert "retries" in snap.error
    finally:
        registry.unregister_workflow("trips.retries", 1)


def test_a_worker_without_the_version_gives_the_run_back_as_it_stood(monkeypatch):
    start_workflow(SCOPE, "given", "trips.wait")
    run_workflows_inline()
    run = WorkflowRun.objects.get(run_id="given")
    before = (run.status, run.wait_kind, run.wait_key, run.advances)

    def missing(name: str, version: int) -> None:
        # A signal comes while this worker holds the run: it leaves a wake-up.
        assert send_signal(SCOPE, "given", "go", {"n": 3}) == SignalOutcome.DELIVERED
        return None

    monkeypatch.setattr(registry, "find_workflow", missing)
    with pytest.raises(VersionMissing):
        advance(run.pk)
    run.refresh_from_db()
    assert (run.status, run.wait_kind, run.wait_key, run.advances) == before
    assert run.driver_token is None
    assert not run.wake_pending
    # The wake-up it left is not lost: an advance job waits for a worker that has it.
    released = Job.objects.filter(
        scope_hash=store.advance_scope_hash(),
        job_id__startswith=f"{store.advance_job_prefix(run.pk)}0:released",
        status=JobStatus.QUEUED,
    )
    assert released.count() == 1
    monkeypatch.undo()
    run_workflows_inline()
    snap = WorkflowScope(SCOPE).get("given")
    assert snap is not None
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == 3


@pytest.mark.parametrize(
    ("text", "value"),
    [("5", 5), ('{"a": [1, 2]}', {"a": [1, 2]}), (" 7 ", 7), ("null", None), ("\n[]\n", [])],
)
def test_json_values_read_back_as_written_whatever_surrounds_them(text: str, value: Any):
    assert validation.from_json(text) == value


@pytest.mark.parametrize("text", ["", "1 2", "[1", "nope"])
def test_json_text_that_is_not_one_value_is_refused(text: str):
    with pytest.raises(json.JSONDecodeError):
        validation.from_json(text)
