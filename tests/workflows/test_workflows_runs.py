"""Runs end to end, driven inline: replay, steps, maps, timers, signals, children,
retries, cancel and resume, and the typed errors of bad input."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from django.db import transaction

from testproject.workflow_checks import tasks as checks
from testproject.workflow_checks.models import Effect
from workflows import (
    RunStatus,
    SignalOutcome,
    StepStatus,
    WorkflowScope,
    send_signal,
    stage_workflow,
    start_workflow,
)
from workflows.testing import TestClock, run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db

SCOPE = "tenant-wf"


class Rollback(Exception):
    pass


def rolled_back(write: Callable[[], object]) -> None:
    """Call ``write`` inside a transaction that then rolls back."""
    with contextlib.suppress(Rollback), transaction.atomic():
        write()
        raise Rollback


def effects(run_id: str, kind: str = "step") -> list[str]:
    return list(
        Effect.objects.filter(run_id=run_id, kind=kind).order_by("id").values_list("key", flat=True)
    )


def test_a_linear_run_records_each_step_once_and_returns_its_output():
    snap = start_workflow(SCOPE, "lin-1", "checks.linear", {"start": 5})
    assert snap.created
    assert snap.status == RunStatus.WAITING
    assert snap.version == 1
    done = run_workflow(SCOPE, "lin-1")
    assert done.status == RunStatus.SUCCEEDED
    assert done.output == {"a": 5, "b": 6}
    assert [(s.key, s.kind, s.status, s.result) for s in done.steps] == [
        ("a", "step", StepStatus.SUCCEEDED, 5),
        ("b", "step", StepStatus.SUCCEEDED, 6),
    ]
    assert effects("lin-1") == ["a", "b"]


def test_replay_returns_recorded_values_without_running_anything(monkeypatch):
    start_workflow(SCOPE, "replay-1", "checks.sleeper", {"seconds": 60})
    clock = TestClock()
    run_workflows_inline(clock=clock)
    assert effects("replay-1") == ["before"]  # waiting on the timer
    calls = []
    real = checks.write_effect

    def spy(*args):
        calls.append(args[1])
        return real(*args)

    monkeypatch.setattr(checks, "write_effect", spy)
    clock.advance(61)
    run_workflows_inline(clock=clock)
    # The recorded "before" returned its value: only "after" ran.
    assert calls == ["after"]
    assert effects("replay-1") == ["before", "after"]
    assert WorkflowScope(SCOPE).get("replay-1").output == "woke"


def test_a_map_fans_out_one_job_per_item_and_returns_results_in_order():
    start_workflow(SCOPE, "map-1", "checks.fanout", {"items": [3, 1, 2]})
    first = run_workflows_inline()
    handlers = [run.handler for run in first]
    assert handlers.count("checks.double") == 3
    snap = WorkflowScope(SCOPE).get("map-1")
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == {"doubled": [6, 2, 4], "total": 12}
    (step, _) = snap.steps
    assert step.kind == "map"
    assert step.items.total == 3
    assert step.items.succeeded == 3
    assert sorted(effects("map-1", "activity")) == ["1", "2", "3"]
    # The run advanced three times: start, the fan-in (once), nothing else.
    assert handlers.count("workflows.advance") == 2


def test_a_map_waits_with_a_count_of_ended_items():
    start_workflow(SCOPE, "map-2", "checks.fanout", {"items": [1, 2]})
    run_workflows_inline(max_attempts_run=2)  # the advance and one item
    snap = WorkflowScope(SCOPE).get("map-2")
    assert snap.status == RunStatus.WAITING
    assert snap.waiting_for == "1 of 2 items"


def test_an_empty_map_returns_an_empty_list_at_once():
    start_workflow(SCOPE, "map-0", "checks.fanout", {"items": []})
    assert run_workflow(SCOPE, "map-0").output == {"doubled": [], "total": 0}


def test_items_that_fail_after_their_retries_fail_the_run_once_all_ended():
    start_workflow(SCOPE, "boom-1", "checks.failing_map")
    snap = run_workflow(SCOPE, "boom-1")
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "boom"
    assert snap.error.startswith("StepFailed: step 'boom' failed: ValueError: 3 of 3 items failed")
    (step,) = snap.steps
    assert step.status == StepStatus.FAILED
    assert step.items.failed == 3
    assert step.attempts == 2  # retries=1: two tries of each item


def test_an_activity_step_runs_as_a_job_and_returns_its_result():
    start_workflow(SCOPE, "act-1", "checks.activity", {"value": 21})
    runs = run_workflows_inline()
    assert "checks.double" in [run.handler for run in runs]
    snap = WorkflowScope(SCOPE).get("act-1")
    assert snap.output == 42
    assert snap.steps[0].kind == "activity"


def test_an_activity_stays_a_plain_function():
    assert checks.double({"run": "x", "value": 4}) == 8


def test_a_timer_resumes_no_earlier_than_its_time():
    start_workflow(SCOPE, "nap-1", "checks.sleeper", {"seconds": 3600})
    clock = TestClock()
    run_workflows_inline(clock=clock)
    snap = WorkflowScope(SCOPE).get("nap-1")
    assert snap.status == RunStatus.WAITING
    assert snap.waiting_for.startswith("timer until ")
    nap = snap.step("nap")
    assert nap.status == StepStatus.WAITING
    assert nap.wake_at is not None
    clock.advance(3599)
    assert run_workflows_inline(clock=clock) == []
    clock.advance(1)
    run_workflows_inline(clock=clock)
    assert WorkflowScope(SCOPE).get("nap-1").status == RunStatus.SUCCEEDED


def test_run_workflow_moves_its_clock_to_each_timer():
    start_workflow(SCOPE, "nap-2", "checks.sleeper", {"seconds": 86400})
    assert run_workflow(SCOPE, "nap-2").output == "woke"


def test_now_is_recorded_and_replayed():
    start_workflow(SCOPE, "clock-1", "checks.clock")
    clock = TestClock()
    first = clock.now
    snap = run_workflow(SCOPE, "clock-1", clock=clock)
    assert snap.output["t"] == first.isoformat()
    assert snap.output["again"] is True


def test_a_signal_wakes_the_waiting_run_with_its_payload():
    start_workflow(SCOPE, "sig-1", "checks.signals", {})
    run_workflows_inline()
    snap = WorkflowScope(SCOPE).get("sig-1")
    assert snap.status == RunStatus.WAITING
    assert snap.waiting_for == "signal approved"
    assert send_signal(SCOPE, "sig-1", "approved", {"by": "ops"}) is SignalOutcome.DELIVERED
    assert send_signal(SCOPE, "sig-1", "approved", {"by": "ops"}) is SignalOutcome.ALREADY_SENT
    run_workflows_inline()
    snap = WorkflowScope(SCOPE).get("sig-1")
    assert snap.output == {"by": "ops"}
    # A finished run: the same signal is ALREADY_SENT, a new one RUN_FINISHED.
    assert send_signal(SCOPE, "sig-1", "approved", {"by": "ops"}) is SignalOutcome.ALREADY_SENT
    assert send_signal(SCOPE, "sig-1", "other") is SignalOutcome.RUN_FINISHED


def test_a_signal_sent_before_the_wait_is_kept():
    start_workflow(SCOPE, "sig-2", "checks.signals", {})
    assert send_signal(SCOPE, "sig-2", "approved", [1, 2]) is SignalOutcome.DELIVERED
    assert run_workflow(SCOPE, "sig-2").output == [1, 2]


def test_the_same_signal_with_another_payload_is_a_conflict_and_changes_nothing():
    from workflows.exceptions import SignalConflict

    start_workflow(SCOPE, "sig-3", "checks.signals", {})
    send_signal(SCOPE, "sig-3", "approved", 1)
    with pytest.raises(SignalConflict):
        send_signal(SCOPE, "sig-3", "approved", 2)
    assert run_workflow(SCOPE, "sig-3").output == 1


def test_a_signal_wait_times_out_in_the_body_once_the_test_moves_the_clock():
    start_workflow(SCOPE, "sig-4", "checks.signals", {"timeout": 600})
    clock = TestClock()
    # run_workflow stops at the wait, timeout or not: the test sends the signal, or
    # moves the clock past the timeout.
    assert run_workflow(SCOPE, "sig-4", clock=clock).status == RunStatus.WAITING
    clock.advance(599)
    assert run_workflow(SCOPE, "sig-4", clock=clock).status == RunStatus.WAITING
    clock.advance(1)
    snap = run_workflow(SCOPE, "sig-4", clock=clock)
    assert snap.output == "timed out"
    assert snap.step("approved").status == StepStatus.FAILED


def test_run_workflow_stops_at_a_signal_wait_with_a_timeout_so_the_test_can_send_it():
    start_workflow(SCOPE, "sig-6", "checks.signals", {"timeout": 86_400})
    clock = TestClock()
    snap = run_workflow(SCOPE, "sig-6", clock=clock)
    assert (snap.status, snap.step("approved").status) == (RunStatus.WAITING, "waiting")
    send_signal(SCOPE, "sig-6", "approved", {"by": "ops"})
    assert run_workflow(SCOPE, "sig-6", clock=clock).output == {"by": "ops"}


def test_a_signal_sent_inside_a_rolled_back_transaction_is_not_delivered():
    start_workflow(SCOPE, "sig-5", "checks.signals", {})
    run_workflows_inline()
    rolled_back(lambda: send_signal(SCOPE, "sig-5", "approved", "lost"))
    run_workflows_inline()
    assert WorkflowScope(SCOPE).get("sig-5").status == RunStatus.WAITING
    with transaction.atomic():
        send_signal(SCOPE, "sig-5", "approved", "kept")
    run_workflows_inline()
    assert WorkflowScope(SCOPE).get("sig-5").output == "kept"


def test_signals_and_control_never_reach_another_scope():
    from workflows.exceptions import RunNotFound

    start_workflow(SCOPE, "sig-6", "checks.signals", {})
    other = WorkflowScope("someone-else")
    assert other.get("sig-6") is None
    with pytest.raises(RunNotFound):
        send_signal("someone-else", "sig-6", "approved")
    with pytest.raises(RunNotFound):
        other.cancel("sig-6")
    with pytest.raises(RunNotFound):
        other.resume("sig-6")
    with pytest.raises(RunNotFound):
        send_signal(SCOPE, "no-such-run", "approved")


def test_a_child_run_lives_in_the_parent_scope_and_returns_its_output():
    start_workflow(SCOPE, "par-1", "checks.parent", {})
    snap = run_workflow(SCOPE, "par-1")
    assert snap.output == {"child": {"a": 10, "b": 11}}
    child = WorkflowScope(SCOPE).get("par-1/kid")
    assert child.status == RunStatus.SUCCEEDED
    assert child.parent_run_id == "par-1"
    assert snap.step("kid").child_run_id == "par-1/kid"


def test_a_failed_child_raises_step_failed_in_the_parent():
    start_workflow(SCOPE, "par-2", "checks.parent", {"child": "checks.failing_map"})
    snap = run_workflow(SCOPE, "par-2")
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "kid"
    assert WorkflowScope(SCOPE).get("par-2/kid").status == RunStatus.FAILED


def test_an_inline_step_is_retried_with_back_off_and_its_failed_tries_roll_back():
    start_workflow(SCOPE, "flaky-1", "checks.flaky", {"fail_times": 2, "retries": 3})
    clock = TestClock()
    run_workflows_inline(clock=clock)
    snap = WorkflowScope(SCOPE).get("flaky-1")
    assert snap.status == RunStatus.WAITING
    assert snap.waiting_for.startswith("retry of flaky at ")
    step = snap.step("flaky")
    assert step.attempts == 1
    assert step.error == "ConnectionError: try 1 failed"
    snap = run_workflow(SCOPE, "flaky-1", clock=clock)
    assert snap.output == "ok after 3"
    assert snap.step("flaky").attempts == 3
    # The failed tries' rows rolled back with them: one row, from the try that won.
    assert effects("flaky-1") == ["flaky"]


def test_retries_exhausted_raise_step_failed_that_the_body_may_catch():
    start_workflow(SCOPE, "flaky-2", "checks.flaky", {"fail_times": 9, "retries": 1, "catch": True})
    snap = run_workflow(SCOPE, "flaky-2")
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == {"caught": "flaky", "type": "ConnectionError", "message": "try 2 failed"}
    assert effects("flaky-2") == []


def test_an_uncaught_step_failure_fails_the_run_naming_the_step_and_resume_retries_it():
    start_workflow(SCOPE, "flaky-3", "checks.flaky", {"fail_times": 2, "retries": 0})
    snap = run_workflow(SCOPE, "flaky-3")
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "flaky"
    assert snap.error.startswith("StepFailed: step 'flaky' failed: ConnectionError: try 1 failed")
    resumed = WorkflowScope(SCOPE).resume("flaky-3")
    assert resumed.status == RunStatus.WAITING
    snap = run_workflow(SCOPE, "flaky-3")
    # Fresh retries (0): the second try fails again; a second resume succeeds.
    assert snap.status == RunStatus.FAILED
    WorkflowScope(SCOPE).resume("flaky-3")
    snap = run_workflow(SCOPE, "flaky-3")
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == "ok after 3"


def test_resume_is_only_for_failed_runs():
    from workflows.exceptions import InvalidTransition

    start_workflow(SCOPE, "res-1", "checks.linear", {})
    with pytest.raises(InvalidTransition):
        WorkflowScope(SCOPE).resume("res-1")


def test_cancelling_a_waiting_run_ends_it_at_once_with_its_children():
    start_workflow(SCOPE, "can-1", "checks.parent", {"child": "checks.signals"})
    run_workflows_inline()
    assert WorkflowScope(SCOPE).get("can-1/kid").status == RunStatus.WAITING
    assert WorkflowScope(SCOPE).cancel("can-1") == "cancelled"
    assert WorkflowScope(SCOPE).get("can-1").status == RunStatus.CANCELLED
    assert WorkflowScope(SCOPE).get("can-1/kid").status == RunStatus.CANCELLED
    assert WorkflowScope(SCOPE).cancel("can-1") == "already_finished"
    run_workflows_inline()
    assert WorkflowScope(SCOPE).get("can-1").status == RunStatus.CANCELLED
    assert send_signal(SCOPE, "can-1/kid", "approved") is SignalOutcome.RUN_FINISHED


def test_using_one_key_twice_fails_the_run_as_non_deterministic():
    snap = (start_workflow(SCOPE, "twice-1", "checks.twice"), run_workflow(SCOPE, "twice-1"))[1]
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("NonDeterministicWorkflow: checkpoint 'same'")
    assert snap.failed_step == "same"
    assert effects("twice-1") == ["same"]


def test_stage_workflow_creates_the_run_only_if_the_transaction_commits():
    from jobs import exceptions as jobs_exceptions
    from workflows.exceptions import AmbientTransactionError, TransactionRequiredError

    with pytest.raises(TransactionRequiredError) as required:
        stage_workflow(SCOPE, "st-1", "checks.linear")
    with pytest.raises(AmbientTransactionError) as ambient, transaction.atomic():
        start_workflow(SCOPE, "st-1", "checks.linear")
    # Also the jobs' errors of the same rule, for code that catches those.
    assert isinstance(required.value, jobs_exceptions.TransactionRequiredError)
    assert isinstance(ambient.value, jobs_exceptions.AmbientTransactionError)
    rolled_back(lambda: stage_workflow(SCOPE, "st-1", "checks.linear"))
    assert WorkflowScope(SCOPE).get("st-1") is None
    assert run_workflows_inline() == []
    with transaction.atomic():
        assert stage_workflow(SCOPE, "st-1", "checks.linear").created
    assert run_workflow(SCOPE, "st-1").status == RunStatus.SUCCEEDED


def test_the_same_request_returns_the_run_and_another_is_a_conflict():
    from workflows.exceptions import WorkflowIdentityConflict

    first = start_workflow(SCOPE, "id-1", "checks.linear", {"start": 1})
    again = start_workflow(SCOPE, "id-1", "checks.linear", {"start": 1})
    assert first.created
    assert not again.created
    for name, value in (("checks.linear", {"start": 2}), ("checks.sleeper", {"start": 1})):
        with pytest.raises(WorkflowIdentityConflict):
            start_workflow(SCOPE, "id-1", name, value)
    # Another scope is another run.
    assert start_workflow("other", "id-1", "checks.linear", {"start": 2}).created


def test_list_filters_by_status_and_name():
    start_workflow(SCOPE, "ls-1", "checks.linear")
    start_workflow(SCOPE, "ls-2", "checks.signals", {})
    run_workflows_inline()
    scope = WorkflowScope(SCOPE)
    assert [r.run_id for r in scope.list(status=RunStatus.SUCCEEDED)] == ["ls-1"]
    assert [r.run_id for r in scope.list(name="checks.signals")] == ["ls-2"]
    assert [r.run_id for r in scope.list(limit=1)] == ["ls-1"]


def test_sleep_until_resumes_no_earlier_than_the_time_given():
    from datetime import timedelta

    from django.utils import timezone

    when = timezone.now() + timedelta(days=2)
    start_workflow(SCOPE, "until-1", "checks.until", {"when": when.isoformat()})
    clock = TestClock()
    run_workflows_inline(clock=clock)
    assert WorkflowScope(SCOPE).get("until-1").waiting_for == f"timer until {when.isoformat()}"
    snap = run_workflow(SCOPE, "until-1", clock=clock)
    assert snap.output == when.isoformat()


def test_activity_arguments_that_are_not_json_are_an_error_naming_the_step():
    start_workflow(SCOPE, "args-1", "checks.bad_args")
    snap = run_workflow(SCOPE, "args-1")
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("InvalidInput: the arguments of activity 'double' item 0:")
    assert snap.steps == ()


def test_resume_runs_a_failed_map_again_and_keeps_recorded_steps():
    checks.FAILING.add(2)
    try:
        start_workflow(SCOPE, "res-map", "checks.resumable")
        snap = run_workflow(SCOPE, "res-map")
    finally:
        checks.FAILING.clear()
    assert snap.status == RunStatus.FAILED
    assert snap.failed_step == "pick"
    assert snap.step("pick").items.failed == 1
    WorkflowScope(SCOPE).resume("res-map")
    snap = run_workflow(SCOPE, "res-map")
    assert snap.output == {"first": 1, "values": [1, 2, 3]}
    assert effects("res-map") == ["first"]


def test_cancelling_a_parent_asks_its_running_child_to_stop():
    from workflows import store
    from workflows.models import WorkflowRun

    start_workflow(SCOPE, "can-2", "checks.parent", {"child": "checks.signals"})
    run_workflows_inline()
    child = WorkflowRun.objects.get(run_id="can-2/kid")
    driver = store.take(child.pk)  # the child's driver is in the middle of an advance
    assert driver is not None
    assert WorkflowScope(SCOPE).cancel("can-2") == "cancelled"
    assert WorkflowScope(SCOPE).get("can-2/kid").cancel_requested
    run_workflows_inline()
    from workflows.engine import advance

    assert advance(child.pk) == "cancelled"
    assert WorkflowScope(SCOPE).get("can-2/kid").status == RunStatus.CANCELLED
