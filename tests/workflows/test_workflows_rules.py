"""The engine's rules: fencing of stale drivers, determinism, versions, cancellation
of running runs, retention and the typed errors of bad input."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core import checks as django_checks
from django.utils import timezone

from jobs.models import Job
from jobs.types import FinishOutcome, JobStatus
from testproject.workflow_checks import tasks as checks
from testproject.workflow_checks.models import Effect
from tests.support.workflows import linear_version_2
from workflows import (
    RunStatus,
    StepStatus,
    WorkflowContext,
    WorkflowScope,
    activity,
    registry,
    send_signal,
    start_workflow,
    store,
    validation,
    workflow,
)
from workflows.context import WorkflowContext as Context
from workflows.exceptions import (
    InvalidInput,
    InvalidWorkflow,
    NonDeterministicWorkflow,
    UnknownWorkflow,
    WorkflowError,
)
from workflows.models import WorkflowRun, WorkflowStep
from workflows.replay import Stop
from workflows.testing import TestClock, run_workflow, run_workflows_inline
from workflows.types import Wait, WaitKind

pytestmark = pytest.mark.django_db

SCOPE = "tenant-rules"

#: What the body of "rules.branch" does at its second checkpoint this time.
BRANCH = {"second": "step"}


@workflow("rules.branch", version=1)
def branch(wf: WorkflowContext) -> Any:
    wf.step("first", checks.write_effect, wf.run_id, "first", 1)
    if BRANCH["second"] == "step":
        wf.sleep("second", 60)
    else:
        wf.step("second", checks.write_effect, wf.run_id, "second", 2)
    return "done"


@workflow("rules.self_cancel", version=1)
def self_cancel(wf: WorkflowContext) -> Any:
    def cancel_then_look() -> bool:
        WorkflowScope(SCOPE).cancel(wf.run_id)
        return wf.cancel_requested

    seen = wf.step("a", cancel_then_look)
    wf.step("b", checks.write_effect, wf.run_id, "b", seen)
    return "unreachable"


@workflow("rules.bad_key", version=1)
def bad_key(wf: WorkflowContext) -> Any:
    return wf.step(" padded", checks.write_effect, wf.run_id, "x", 1)


@workflow("rules.bad_result", version=1)
def bad_result(wf: WorkflowContext) -> Any:
    return wf.step("obj", lambda: object())


@workflow("rules.by_name", version=1)
def by_name(wf: WorkflowContext) -> Any:
    doubled = wf.map("double", "checks.double", [{"run": wf.run_id, "value": 1}])
    return wf.map("unknown", wf.input["activity"], doubled) if wf.input else doubled


@workflow("rules.plain_map", version=1)
def plain_map(wf: WorkflowContext) -> Any:
    return wf.map("plain", lambda item: item, [1])


@workflow("rules.activity_options", version=1)
def activity_options(wf: WorkflowContext) -> Any:
    return wf.step("double", checks.double, {"run": wf.run_id, "value": 1}, retries=5)


def nothing_written() -> bool:
    return not WorkflowRun.objects.exists() and not Job.objects.exists()


def test_a_stale_driver_records_nothing():
    snap = start_workflow(SCOPE, "stale-1", "checks.linear", {"start": 3})
    pk = WorkflowRun.objects.get(run_id=snap.run_id).pk
    first = store.take(pk)
    second = store.take(pk)
    assert first is not None
    assert second is not None
    stale = Context(first, timezone.now)
    with pytest.raises(Stop):
        stale.step("a", checks.write_effect, "stale-1", "a", 3)
    # Its step ran but rolled back with its checkpoint: nothing recorded.
    assert not WorkflowStep.objects.exists()
    assert not Effect.objects.exists()
    anything = Wait(kind=WaitKind.TIMER, key="nap")
    assert store.suspend(first, anything, timezone.now()) is store.Suspended.STALE
    current = Context(second, timezone.now)
    assert current.step("a", checks.write_effect, "stale-1", "a", 3) == 3
    assert list(WorkflowStep.objects.values_list("key", flat=True)) == ["a"]


def test_another_advance_job_never_takes_a_running_run_but_makes_its_driver_replay():
    snap = start_workflow(SCOPE, "pending-1", "checks.signals", {})
    pk = WorkflowRun.objects.get(run_id=snap.run_id).pk
    driver = store.take(pk, "job-1")
    assert driver is not None
    assert store.take(pk, "job-2") is None
    assert WorkflowRun.objects.get(pk=pk).wake_pending
    now = timezone.now()
    approved = Wait(kind=WaitKind.SIGNAL, key="approved")
    assert store.suspend(driver, approved, now) is store.Suspended.WAKE_PENDING
    assert store.suspend(driver, approved, now) is store.Suspended.WAITING
    # The job that held it may take it back from RUNNING (its worker died).
    again = store.take(pk, "job-3")
    assert again is not None
    assert store.take(pk, "job-3") is not None
    assert WorkflowRun.objects.get(pk=pk).driver_job == "job-3"


def test_a_signal_sent_while_the_run_is_driven_is_read_before_it_waits(monkeypatch):
    from workflows import engine

    start_workflow(SCOPE, "pending-2", "checks.signals", {})
    pk = WorkflowRun.objects.get(run_id="pending-2").pk
    real = store.suspend

    def signal_then_suspend(*args: Any) -> Any:
        # The signal commits after the replay looked for it, before the run waits.
        if not WorkflowRun.objects.get(pk=pk).signals.exists():
            assert send_signal(SCOPE, "pending-2", "approved", "late") == "delivered"
        return real(*args)

    monkeypatch.setattr(store, "suspend", signal_then_suspend)
    assert engine.advance(pk, "job-1") == "succeeded"
    assert WorkflowScope(SCOPE).get("pending-2").output == "late"


def test_a_checkpoint_reached_as_another_kind_fails_the_run_as_non_deterministic():
    BRANCH["second"] = "step"
    start_workflow(SCOPE, "nd-1", "rules.branch")
    run_workflows_inline()
    assert WorkflowScope(SCOPE).get("nd-1").waiting_for.startswith("timer until")
    BRANCH["second"] = "other"
    try:
        snap = run_workflow(SCOPE, "nd-1")
    finally:
        BRANCH["second"] = "step"
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "second"
    assert snap.error.startswith(
        "NonDeterministicWorkflow: checkpoint 'second': recorded as a sleep checkpoint"
    )
    # The recorded first step did not run again.
    assert list(Effect.objects.values_list("key", flat=True)) == ["first"]


def test_a_running_inline_step_sees_its_cancellation_and_the_run_ends_at_the_next_checkpoint():
    start_workflow(SCOPE, "cancel-1", "rules.self_cancel")
    snap = run_workflow(SCOPE, "cancel-1")
    assert snap.status == RunStatus.CANCELLED
    assert snap.step("a").result is True
    assert snap.step("b") is None
    assert not Effect.objects.exists()


def test_cancelling_a_run_waiting_on_items_cancels_their_jobs():
    start_workflow(SCOPE, "cancel-2", "checks.fanout", {"items": [1, 2, 3]})
    run_workflows_inline(max_attempts_run=1)
    assert WorkflowScope(SCOPE).cancel("cancel-2") == "cancelled"
    items = Job.objects.filter(handler="checks.double")
    assert set(items.values_list("status", flat=True)) == {JobStatus.CANCELLED}
    assert run_workflows_inline() == []
    snap = WorkflowScope(SCOPE).get("cancel-2")
    assert snap.status == RunStatus.CANCELLED
    assert snap.step("double").status == StepStatus.CANCELLED
    assert not Effect.objects.filter(kind="activity").exists()


def test_a_worker_without_the_run_version_leaves_it_waiting_and_check_names_it():
    # A run of version 2, started by code this worker does not have.
    store.create_run(
        validation.scope_hash(SCOPE),
        "v2-1",
        "checks.linear",
        2,
        "{}",
        staged=False,
    )
    runs = run_workflows_inline()
    assert [run.outcome for run in runs] == [FinishOutcome.SNOOZED]
    snap = WorkflowScope(SCOPE).get("v2-1")
    assert snap.status == RunStatus.WAITING
    warnings = [m for m in django_checks.run_checks() if m.id == "workflows.W001"]
    assert [m.obj for m in warnings] == ["checks.linear v2"]
    assert "'checks.linear' version 2" in warnings[0].msg
    with linear_version_2():
        snap = run_workflow(SCOPE, "v2-1", clock=TestClock(timezone.now() + timedelta(hours=1)))
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == "v2"


def test_version_none_takes_the_highest_registered_version():
    @workflow("rules.versioned", version=1)
    def v1(wf: WorkflowContext) -> Any:
        return 1

    @workflow("rules.versioned", version=3)
    def v3(wf: WorkflowContext) -> Any:
        return 3

    try:
        assert start_workflow(SCOPE, "ver-1", "rules.versioned").version == 3
        assert start_workflow(SCOPE, "ver-2", "rules.versioned", version=1).version == 1
        assert run_workflow(SCOPE, "ver-1").output == 3
        assert run_workflow(SCOPE, "ver-2").output == 1
        with pytest.raises(UnknownWorkflow):
            start_workflow(SCOPE, "ver-3", "rules.versioned", version=2)
    finally:
        registry.unregister_workflow("rules.versioned", 1)
        registry.unregister_workflow("rules.versioned", 3)


def test_a_second_definition_of_a_name_and_version_is_invalid():
    with pytest.raises(InvalidWorkflow):

        @workflow("checks.linear", version=1)
        def other(wf: WorkflowContext) -> Any:
            return None

    with pytest.raises(InvalidWorkflow):
        workflow("bad name!", version=1)
    # An activity is a job handler of its name: a job handler's name is taken.
    with pytest.raises(InvalidWorkflow):
        activity("workflows.advance")(lambda item: item)
    with pytest.raises(InvalidWorkflow):
        activity("checks.double")(lambda item: item)
    assert registry.activity_of(checks.double) is registry.get_activity("checks.double")
    with pytest.raises(InvalidWorkflow):
        workflow("rules.x", version=0)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: start_workflow(SCOPE, "bad-1", "checks.linear", {"x": object()}), InvalidInput),
        (lambda: start_workflow(SCOPE, "bad-1", "checks.linear", float("nan")), InvalidInput),
        (lambda: start_workflow(SCOPE, "", "checks.linear"), InvalidInput),
        (lambda: start_workflow(SCOPE, " x", "checks.linear"), InvalidInput),
        (lambda: start_workflow(SCOPE, None, "checks.linear"), InvalidInput),
        (lambda: start_workflow(None, "bad-1", "checks.linear"), InvalidInput),
        (lambda: start_workflow(SCOPE, "bad-1", "no.such.workflow"), UnknownWorkflow),
        (lambda: start_workflow(SCOPE, "bad-1", "checks.linear", version=9), UnknownWorkflow),
        (lambda: start_workflow(SCOPE, "bad-1", 42), InvalidWorkflow),
        (lambda: send_signal(SCOPE, "bad-1", "approved", {1, 2}), InvalidInput),
    ],
)
def test_bad_input_is_a_typed_error_and_writes_nothing(call, error):
    with pytest.raises(error) as raised:
        call()
    assert isinstance(raised.value, WorkflowError)
    assert nothing_written()


def test_a_bad_signal_key_or_payload_changes_nothing():
    start_workflow(SCOPE, "bad-sig", "checks.signals", {})
    for key, payload in (("", 1), ("a\x00b", 1), ("ok", object())):
        with pytest.raises(InvalidInput):
            send_signal(SCOPE, "bad-sig", key, payload)
    assert not WorkflowRun.objects.get(run_id="bad-sig").signals.exists()


@pytest.mark.parametrize(
    ("name", "error"),
    [
        ("rules.bad_key", "InvalidInput: checkpoint key must not start or end with whitespace"),
        ("rules.bad_result", "StepFailed: step 'obj' failed: InvalidInput: the result of step"),
        ("rules.plain_map", "InvalidInput: map 'plain': "),
        (
            "rules.activity_options",
            "InvalidInput: step 'double': 'checks.double' is an @activity, whose retries",
        ),
    ],
)
def test_bad_input_in_a_body_fails_the_run_with_a_clear_error(name, error):
    start_workflow(SCOPE, "body-1", name)
    snap = run_workflow(SCOPE, "body-1")
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith(error)


def test_an_activity_is_also_called_by_its_name_and_an_unknown_name_is_an_error():
    start_workflow(SCOPE, "name-1", "rules.by_name")
    assert run_workflow(SCOPE, "name-1").output == [2]
    start_workflow(SCOPE, "name-2", "rules.by_name", {"activity": "no.such.activity"})
    snap = run_workflow(SCOPE, "name-2")
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("UnknownActivity: no activity registered as 'no.such.activity'")
    assert [step.key for step in snap.steps] == ["double"]


def test_misspelt_workflow_and_activity_names_get_a_suggestion():
    with pytest.raises(
        UnknownWorkflow, match=r"'checks.lienar' \(did you mean 'checks.linear'\?\)"
    ):
        start_workflow(SCOPE, "typo-1", "checks.lienar")
    with pytest.raises(UnknownWorkflow) as nothing_close:
        start_workflow(SCOPE, "typo-1", "unlike.anything")
    assert "did you mean" not in str(nothing_close.value)
    start_workflow(SCOPE, "typo-2", "rules.by_name", {"activity": "checks.doubel"})
    snap = run_workflow(SCOPE, "typo-2")
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith(
        "UnknownActivity: no activity registered as 'checks.doubel' (did you mean 'checks.double'?)"
    )


def test_nondeterministic_workflow_names_its_key():
    error = NonDeterministicWorkflow("k", "used twice")
    assert error.key == "k"
    assert str(error) == "checkpoint 'k': used twice"


def test_retention_deletes_finished_runs_with_their_checkpoints_and_keeps_the_rest():
    start_workflow(SCOPE, "old-1", "checks.parent", {})
    start_workflow(SCOPE, "live-1", "checks.signals", {})
    run_workflow(SCOPE, "old-1")
    run_workflows_inline()
    later = timezone.now() + timedelta(seconds=1)
    assert store.purge_finished(older_than=later) == 1
    assert WorkflowScope(SCOPE).get("old-1") is None
    assert WorkflowScope(SCOPE).get("old-1/kid") is None
    assert WorkflowScope(SCOPE).get("live-1") is not None
    assert set(WorkflowStep.objects.values_list("run__run_id", flat=True)) == {"live-1"}
    assert store.purge_finished(older_than=later) == 0


@workflow("rules.timeout", version=1)
def step_timeout(wf: WorkflowContext) -> Any:
    def until_told_to_stop() -> str:
        while not wf.cancel_requested:
            pass
        return "stopped"

    return wf.step("slow", until_told_to_stop, timeout=0.001, retries=1)


def test_an_inline_step_past_its_timeout_sees_cancel_requested_and_its_try_fails():
    start_workflow(SCOPE, "slow-1", "rules.timeout")
    snap = run_workflow(SCOPE, "slow-1")
    assert snap.status == RunStatus.FAILED
    step = snap.step("slow")
    assert step.attempts == 2
    assert step.error.startswith("TimeoutError: step 'slow' ran longer than its timeout")
    # Its run was never cancelled: only the step's deadline passed.
    assert not snap.cancel_requested


def test_a_database_error_outside_a_step_fails_the_advance_not_the_run(monkeypatch):
    from django.db import OperationalError

    from workflows.engine import advance

    start_workflow(SCOPE, "db-1", "checks.linear")
    pk = WorkflowRun.objects.get(run_id="db-1").pk
    real = store.record_step

    def outage(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("the database went away")

    monkeypatch.setattr(store, "record_step", outage)
    with pytest.raises(OperationalError):
        advance(pk)
    assert WorkflowRun.objects.get(pk=pk).status == RunStatus.RUNNING
    monkeypatch.setattr(store, "record_step", real)
    assert advance(pk) == "succeeded"
    assert list(Effect.objects.values_list("key", flat=True)) == ["a", "b"]


def test_purge_workflows_deletes_finished_runs_past_the_cutoff():
    from datetime import timedelta
    from io import StringIO

    from django.core.management import call_command
    from django.db.models import F

    from workflows.models import WorkflowRun

    start_workflow(SCOPE, "purge-1", "checks.linear")
    run_workflow(SCOPE, "purge-1")
    start_workflow(SCOPE, "purge-2", "checks.linear")
    run_workflow(SCOPE, "purge-2")
    WorkflowRun.objects.filter(run_id="purge-1").update(
        finished_at=F("finished_at") - timedelta(days=2)
    )
    out = StringIO()
    call_command("purge_workflows", stdout=out)  # the retention: 30 days
    assert out.getvalue().startswith("deleted 0 finished run(s) before ")
    out = StringIO()
    call_command("purge_workflows", "--older-than-days", "1", "--dry-run", stdout=out)
    assert out.getvalue().startswith("1 finished run(s) before ")
    assert WorkflowScope(SCOPE).get("purge-1") is not None
    out = StringIO()
    call_command("purge_workflows", "--older-than-days", "1", stdout=out)
    assert out.getvalue().startswith("deleted 1 finished run(s) before ")
    assert WorkflowScope(SCOPE).get("purge-1") is None
    assert WorkflowScope(SCOPE).get("purge-2") is not None


def test_a_signal_sent_by_a_consumer_commits_with_its_inbox_record():
    import uuid

    from django.db import transaction

    from outbox.inbox import consume

    start_workflow(SCOPE, "inbox-1", "checks.signals", {})
    run_workflows_inline()
    message = uuid.uuid4()

    class Crash(Exception):
        pass

    def handle(payload: str) -> bool:
        with transaction.atomic(), consume("approvals", message) as fresh:
            if fresh:
                send_signal(SCOPE, "inbox-1", "approved", payload)
                if payload == "crash":
                    raise Crash
            return fresh

    with pytest.raises(Crash):
        handle("crash")
    assert not WorkflowRun.objects.get(run_id="inbox-1").signals.exists()
    assert handle("ok") is True
    assert handle("ok") is False  # the redelivered message: consumed once
    assert run_workflow(SCOPE, "inbox-1").output == "ok"


def test_each_advance_and_inline_step_is_a_span_under_its_job_attempt(settings, spans):
    settings.JOBS = {**settings.JOBS, "TRACING": True}
    settings.WORKFLOWS = {"TRACING": True}
    start_workflow(SCOPE, "traced-1", "checks.flaky", {"fail_times": 1, "retries": 1})
    run_workflow(SCOPE, "traced-1")
    finished = spans.get_finished_spans()
    advances = [s for s in finished if s.name == "workflow.advance"]
    steps = [s for s in finished if s.name == "workflow.step"]
    assert [s.attributes["workflow.outcome"] for s in advances] == ["waiting", "succeeded"]
    assert [s.attributes["workflow.try"] for s in steps] == [1, 2]
    assert steps[0].status.status_code.name == "ERROR"
    by_id = {s.context.span_id: s for s in finished}
    for step, advance in zip(steps, advances, strict=True):
        assert step.parent.span_id == advance.context.span_id
        assert by_id[advance.parent.span_id].name.startswith("job")


@pytest.mark.django_db(transaction=True)
def test_metrics_count_runs_and_steps_and_gauge_unfinished_runs(settings):
    """(A transactional test: a run counts as started when its transaction commits.)"""
    from prometheus_client import REGISTRY

    settings.WORKFLOWS = {"METRICS": True}

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    started = value("ledon_workflow_runs_started_total", workflow="checks.flaky")
    failed = value("ledon_workflow_runs_finished_total", workflow="checks.flaky", outcome="failed")
    tries = value(
        "ledon_workflow_step_seconds_count", workflow="checks.flaky", kind="step", outcome="failed"
    )
    start_workflow(SCOPE, "metered-1", "checks.flaky", {"fail_times": 5, "retries": 1})
    start_workflow(SCOPE, "metered-2", "checks.signals", {})
    run_workflow(SCOPE, "metered-1")
    run_workflows_inline()
    assert value("ledon_workflow_runs_started_total", workflow="checks.flaky") == started + 1
    assert (
        value("ledon_workflow_runs_finished_total", workflow="checks.flaky", outcome="failed")
        == failed + 1
    )
    assert (
        value(
            "ledon_workflow_step_seconds_count",
            workflow="checks.flaky",
            kind="step",
            outcome="failed",
        )
        == tries + 2
    )
    assert value("ledon_workflow_runs", workflow="checks.signals", status="waiting") == 1


def test_an_item_job_no_worker_can_run_fails_its_item_and_the_run_goes_on(settings):
    from jobs import handlers as job_handlers
    from workflows.handlers import register_activity_handler

    settings.JOBS = {**settings.JOBS, "UNKNOWN_HANDLER_RETRY_SECONDS": 0}
    start_workflow(SCOPE, "orphan-1", "checks.activity", {"value": 2})
    job_handlers.unregister("checks.double", 1)
    try:
        snap = run_workflow(SCOPE, "orphan-1")
    finally:
        register_activity_handler(registry.get_activity("checks.double"))
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith(
        "StepFailed: step 'double' failed: ActivityJobEnded: its job ended Failed without "
        "recording it: "
    )
    assert "checks.double" in snap.error


def test_a_run_whose_advance_job_fails_for_good_is_taken_by_a_new_one(monkeypatch):
    from django.db import OperationalError

    from jobs.models import Job

    start_workflow(SCOPE, "released-1", "checks.linear")
    Job.objects.filter(handler=store.ADVANCE_HANDLER).update(max_attempts=1)
    real = store.record_step

    def outage(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("the database went away")

    monkeypatch.setattr(store, "record_step", outage)
    (failed,) = run_workflows_inline(max_attempts_run=1)
    assert failed.outcome == FinishOutcome.FAILED
    run = WorkflowScope(SCOPE).get("released-1")
    assert run.status == RunStatus.WAITING
    assert run.waiting_for == "a new advance (the last one failed)"
    monkeypatch.setattr(store, "record_step", real)
    assert run_workflow(SCOPE, "released-1").status == RunStatus.SUCCEEDED
