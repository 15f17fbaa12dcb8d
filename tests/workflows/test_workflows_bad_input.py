"""No input wedges a run, and bad input is a typed error that writes nothing.

A body that builds a bad checkpoint key or child id from its data fails its run with
``InvalidInput`` (never an advance retried for ever on a database error), and a
cancel asked for first still lands. What ``start_workflow`` accepts, every other call
reaches; what a caller hands in is refused with ``InvalidInput`` before anything is
written, never with the driver's or the calendar's own error.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import DataError, connection
from django.test.utils import CaptureQueriesContext

from jobs.models import Job
from testproject.workflow_checks import tasks as checks
from testproject.workflow_checks.models import Effect
from workflows import (
    RunStatus,
    SignalOutcome,
    WorkflowContext,
    WorkflowScope,
    activity,
    send_signal,
    start_workflow,
    store,
    validation,
    workflow,
)
from workflows.exceptions import InvalidInput, InvalidTransition, RunNotFound
from workflows.models import WorkflowRun
from workflows.testing import TestClock, run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-bad-input"

#: What each run's body hands its checkpoint, by run id (set by each test).
GIVEN: dict[str, Any] = {}


@workflow("badinput.key", version=1)
def key_from_data(wf: WorkflowContext) -> Any:
    wf.step("first", checks.write_effect, wf.run_id, "first", 1)
    return wf.step(GIVEN[wf.run_id], checks.write_effect, wf.run_id, "second", 2)


@workflow("badinput.cancel_then_key", version=1)
def cancel_then_key(wf: WorkflowContext) -> Any:
    wf.step("cancel", lambda: WorkflowScope(SCOPE).cancel(wf.run_id))
    return wf.step(GIVEN[wf.run_id], checks.write_effect, wf.run_id, "second", 2)


BAD_KEYS = {"long": "k" * 201, "nul": "a\x00b", "surrogate": "x\ud800"}


@pytest.mark.parametrize("bad", sorted(BAD_KEYS))
def test_a_bad_key_built_from_data_fails_the_run(bad):
    GIVEN[bad] = BAD_KEYS[bad]
    start_workflow(SCOPE, bad, "badinput.key")
    run_workflows_inline()
    snap = WorkflowScope(SCOPE).get(bad)
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("InvalidInput: checkpoint key "), snap.error
    assert snap.failed_step == ""  # the bad key names no checkpoint
    assert [step.key for step in snap.steps] == ["first"]
    assert not Job.objects.filter(status__in=["queued", "running"]).exists()


@pytest.mark.parametrize("bad", sorted(BAD_KEYS))
def test_a_cancel_asked_for_before_a_bad_key_lands_first(bad):
    GIVEN[f"c-{bad}"] = BAD_KEYS[bad]
    start_workflow(SCOPE, f"c-{bad}", "badinput.cancel_then_key")
    run_workflows_inline()
    snap = WorkflowScope(SCOPE).get(f"c-{bad}")
    assert snap.status == RunStatus.CANCELLED
    assert not Effect.objects.exists()


@workflow("badinput.nest", version=1)
def nest(wf: WorkflowContext) -> Any:
    """Starts a child of itself under a 200-character key, five deep: the fourth
    generation's id would be longer than a run id may be."""
    depth = wf.input
    if depth == 5:
        return depth
    return wf.child("k" * 200, "badinput.nest", depth + 1)


def test_a_child_id_past_the_longest_run_id_fails_the_parent_that_starts_it():
    top = "r" * 200
    start_workflow(SCOPE, top, "badinput.nest", 0)
    run_workflows_inline()
    runs = {len(run.run_id): run for run in WorkflowRun.objects.all()}
    assert sorted(runs) == [200, 401, 602, 803]
    deepest = runs[803]
    assert deepest.status == RunStatus.FAILED
    assert deepest.failed_step == "k" * 200
    assert deepest.error.startswith("InvalidInput: child 'kkk")
    assert "1004 characters" in deepest.error
    # Every run of the family is reachable, and each parent failed with its child.
    assert {run.status for run in runs.values()} == {RunStatus.FAILED}
    for run in runs.values():
        assert WorkflowScope(SCOPE).get(run.run_id).status == RunStatus.FAILED
        assert send_signal(SCOPE, run.run_id, "any") is SignalOutcome.RUN_FINISHED


@pytest.mark.parametrize(
    "char", ["\u00a0", "\u200b", "\u202e", "\x85", "\u2028", "\ufeff"], ids=ascii
)
def test_every_run_id_start_accepts_is_reached_by_every_other_call(char):
    run_id = f"order{char}7"
    assert start_workflow(SCOPE, run_id, "checks.signals", {}).created
    run_workflows_inline()
    runs = WorkflowScope(SCOPE)
    assert runs.get(run_id).waiting_for == "signal approved"
    assert [snap.run_id for snap in runs.list()] == [run_id]
    assert send_signal(SCOPE, run_id, "approved", 1) is SignalOutcome.DELIVERED
    assert runs.cancel(run_id) == "cancelled"
    with pytest.raises(InvalidTransition):
        runs.resume(run_id)


@pytest.mark.parametrize(
    "run_id", ["a\x00b", "x\ud800", "", " padded", "tab\there", 42, None, "r" * 1001], ids=ascii
)
def test_a_run_id_no_run_can_have_is_refused_by_every_lookup(run_id):
    start_workflow(SCOPE, "real", "checks.signals", {})
    runs = WorkflowScope(SCOPE)
    for call in (
        lambda: runs.get(run_id),
        lambda: runs.cancel(run_id),
        lambda: runs.resume(run_id),
        lambda: send_signal(SCOPE, run_id, "approved", 1),
    ):
        with pytest.raises(InvalidInput, match="run id"):
            call()
    with pytest.raises(RunNotFound):
        runs.cancel("r" * 1000)  # as long as a child's id may be: looked up
    assert WorkflowRun.objects.get().status == RunStatus.WAITING


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "a\x00b"},
        {"name": "x\ud800"},
        {"name": 7},
        {"limit": 10**30},
        {"limit": -1},
        {"limit": 1.5},
        {"status": ["waiting"]},
        {"status": "paused"},
    ],
    ids=ascii,
)
def test_bad_list_arguments_are_refused_typed(kwargs):
    start_workflow(SCOPE, "listed", "checks.signals", {})
    with pytest.raises(InvalidInput):
        WorkflowScope(SCOPE).list(**kwargs)


#: Every bad wait or timeout a body can hand over, by run id.
BAD_WAITS: dict[str, Any] = {
    "signal-nan": lambda wf: wf.wait_for_signal("w", timeout=float("nan")),
    "signal-inf": lambda wf: wf.wait_for_signal("w", timeout=float("inf")),
    "signal-huge": lambda wf: wf.wait_for_signal("w", timeout=1e308),
    "sleep-huge": lambda wf: wf.sleep("w", 1e308),
    "until-past-the-calendar": lambda wf: wf.sleep_until(
        "w", datetime.max.replace(tzinfo=timezone(timedelta(hours=-5)))
    ),
    "step-nan": lambda wf: wf.step(
        "w", checks.write_effect, wf.run_id, "w", 1, timeout=float("nan")
    ),
    "step-inf": lambda wf: wf.step(
        "w", checks.write_effect, wf.run_id, "w", 1, timeout=float("inf")
    ),
    "map-set": lambda wf: wf.map("w", same, {1, 2}),
    "step-args": lambda wf: wf.step("w", checks.write_effect, wf.run_id, "w", object()),
    "step-kwargs": lambda wf: wf.step("w", checks.write_effect, wf.run_id, "w", value={1}),
}


@workflow("badinput.wait", version=1)
def bad_wait(wf: WorkflowContext) -> Any:
    return BAD_WAITS[wf.run_id](wf)


@pytest.mark.parametrize("run_id", sorted(BAD_WAITS))
def test_a_bad_wait_timeout_or_argument_fails_the_run_typed_before_anything_runs(run_id):
    start_workflow(SCOPE, run_id, "badinput.wait")
    snap = run_workflow(SCOPE, run_id, clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("InvalidInput: "), snap.error
    assert snap.failed_step == "w"
    assert snap.steps == ()
    assert not Effect.objects.exists()
    assert not Job.objects.filter(handler="badinput.same").exists()


def test_a_value_the_database_refuses_fails_the_run_instead_of_its_advance(monkeypatch):
    real = store.record_step

    def refused(*args: Any, **kwargs: Any) -> Any:
        if args[2] == "b":
            raise DataError("value too long for type character varying(200)")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "record_step", refused)
    start_workflow(SCOPE, "refused", "checks.linear")
    run_workflows_inline()
    snap = WorkflowScope(SCOPE).get("refused")
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith("DataError: value too long")
    assert not Job.objects.filter(status__in=["queued", "running"]).exists()


@workflow("badinput.parent", version=1)
def slash_parent(wf: WorkflowContext) -> Any:
    return wf.child("lines/7", "checks.linear", {"start": 1})


def test_a_childs_parent_is_its_parent_whatever_its_key_holds():
    start_workflow(SCOPE, "order", "badinput.parent")
    run_workflow(SCOPE, "order")
    child = WorkflowScope(SCOPE).get("order/lines/7")
    assert child.parent_run_id == "order"
    assert [run.parent_run_id for run in WorkflowScope(SCOPE).list()] == [None, "order"]


@workflow("badinput.echo", version=1)
def echo(wf: WorkflowContext) -> Any:
    return wf.input


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def called_deep(frames: int, fn: Any) -> Any:
    return fn() if frames == 0 else called_deep(frames - 1, fn)


def test_an_input_accepted_at_start_is_accepted_as_the_runs_output():
    deepest = nested(validation.MAX_VALUE_DEPTH)
    start_workflow(SCOPE, "deep", "badinput.echo", deepest)
    # However deep the stack of the worker that returns it.
    limit = sys.getrecursionlimit()
    snap = called_deep(limit // 2, lambda: run_workflow(SCOPE, "deep"))
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == deepest
    # One level deeper is refused at start, however shallow the caller's stack: no
    # input can pass there and fail the run later.
    for depth in (validation.MAX_VALUE_DEPTH + 1, limit - 40):
        with pytest.raises(InvalidInput, match=r"levels deep|nested too deeply"):
            start_workflow(SCOPE, f"deeper-{depth}", "badinput.echo", nested(depth))
    assert WorkflowRun.objects.count() == 1


@activity("badinput.same")
def same(value: int) -> int:
    return value


@workflow("badinput.shapes", version=1)
def shapes(wf: WorkflowContext) -> Any:
    wf.map("items", same, [1, 2])
    if wf.input:
        wf.child("kid", "badinput.shapes", 0)
    return wf.wait_for_signal("done")


def test_list_reads_any_number_of_runs_in_three_queries():
    def queries_for(runs: int) -> int:
        for n in range(WorkflowRun.objects.filter(parent=None).count(), runs):
            start_workflow(SCOPE, f"shape-{n}", "badinput.shapes", 1)
        run_workflows_inline()
        with CaptureQueriesContext(connection) as captured:
            listed = WorkflowScope(SCOPE).list()
        assert len(listed) == 2 * runs
        assert all(snap.step("items").items.succeeded == 2 for snap in listed)
        return len(captured.captured_queries)

    assert queries_for(2) == queries_for(6) == 3
    kid = WorkflowScope(SCOPE).get("shape-0")
    assert kid.step("kid").child_run_id == "shape-0/kid"


def test_a_sleep_until_the_end_of_the_calendar_in_utc_is_accepted():
    # The last representable time is a valid (if distant) wake time.
    GIVEN["last"] = datetime.max.replace(tzinfo=UTC)
    start_workflow(SCOPE, "last", "badinput.until")
    run_workflows_inline()
    assert WorkflowScope(SCOPE).get("last").waiting_for.startswith("timer until 9999-12-31")


@workflow("badinput.until", version=1)
def until(wf: WorkflowContext) -> Any:
    wf.sleep_until("end", GIVEN[wf.run_id])
