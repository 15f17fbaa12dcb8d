"""A failed run names the checkpoint that failed it: a step whose retries ran out, and
also a checkpoint that raised (bad arguments, however they were passed); an error
the body raised itself names none."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from workflows import RunStatus, WorkflowContext, start_workflow, workflow
from workflows.exceptions import InvalidInput
from workflows.testing import TestClock, run_workflow

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-failed-step"


@workflow("failedstep.bad_sleep", version=1)
def bad_sleep(wf: WorkflowContext) -> Any:
    wf.step("first", lambda: 1)
    wf.sleep("nap", -5)


@workflow("failedstep.not_json", version=1)
def not_json(wf: WorkflowContext) -> Any:
    return wf.step(key="bytes", fn=lambda: b"raw")


@workflow("failedstep.bad_timeout", version=1)
def bad_timeout(wf: WorkflowContext) -> Any:
    return wf.wait_for_signal(key="approved", timeout="soon")


@workflow("failedstep.own_error", version=1)
def own_error(wf: WorkflowContext) -> Any:
    wf.step("first", lambda: 1)
    raise ValueError("the body's own mistake")


@workflow("failedstep.caught_then_other", version=1)
def caught_then_other(wf: WorkflowContext) -> Any:
    with contextlib.suppress(InvalidInput):
        wf.sleep("nap", -5)
    raise RuntimeError("something after it")


@pytest.mark.parametrize(
    ("name", "failed_step", "error_start"),
    [
        ("failedstep.bad_sleep", "nap", "InvalidInput: "),
        ("failedstep.not_json", "bytes", "StepFailed: "),
        ("failedstep.bad_timeout", "approved", "InvalidInput: "),
        ("failedstep.own_error", "", "ValueError: the body's own mistake"),
        ("failedstep.caught_then_other", "", "RuntimeError: something after it"),
    ],
)
def test_the_failed_step_is_the_checkpoint_that_raised(
    name: str, failed_step: str, error_start: str
) -> None:
    start_workflow(SCOPE, name, name)
    snap = run_workflow(SCOPE, name, clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith(error_start), snap.error
    assert snap.failed_step == failed_step
