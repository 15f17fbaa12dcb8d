"""The jobs' bound on snoozes (``JOBS["MAX_SNOOZES"]``) never cuts the waits of the
workflows' own jobs: an advance that snoozes while no worker has the run's version,
and an activity item that snoozes between its activity's retries."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobs.types import FinishOutcome
from tests.support.workflows import linear_version_2
from workflows import (
    RunStatus,
    StepStatus,
    WorkflowScope,
    start_workflow,
    store,
    validation,
)
from workflows.testing import TestClock, run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db

SCOPE = "tenant-snooze-bound"


@pytest.fixture
def no_snoozes(settings: Any) -> None:
    settings.JOBS = {**settings.JOBS, "MAX_SNOOZES": 0}


@pytest.mark.usefixtures("no_snoozes")
def test_a_run_waits_for_its_version_past_the_snooze_bound() -> None:
    scope_hash = validation.scope_hash(SCOPE)
    store.create_run(scope_hash, "v2-wait", "checks.linear", 2, "{}", staged=False)
    clock = TestClock()
    for _ in range(3):  # a deploy longer than the bound allows snoozes
        runs = run_workflows_inline(clock=clock)
        assert [run.outcome for run in runs] == [FinishOutcome.SNOOZED]
        clock.advance(3600)
    assert WorkflowScope(SCOPE).get("v2-wait").status == RunStatus.WAITING
    with linear_version_2():
        snap = run_workflow(SCOPE, "v2-wait", clock=TestClock(timezone.now() + timedelta(days=1)))
    assert snap.status == RunStatus.SUCCEEDED
    assert snap.output == "v2"


@pytest.mark.usefixtures("no_snoozes")
def test_an_activity_gets_all_its_retries_past_the_snooze_bound() -> None:
    start_workflow(SCOPE, "map-retries", "checks.failing_map")
    snap = run_workflow(SCOPE, "map-retries", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    step = snap.step("boom")
    assert step.status == StepStatus.FAILED
    assert step.attempts == 2  # the first try and its one retry
    assert step.error.startswith("ValueError: 3 of 3 items failed; item 0: cannot take 1")
