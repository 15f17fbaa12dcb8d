"""A run id names one request: asking again with another workflow, version or input
is WorkflowIdentityConflict naming what differs, and writes nothing; asking again
without a version after a deploy added one finds the run; a run the caller started
under a child's id is not that child."""

from __future__ import annotations

import pytest
from django.db import transaction

from tests.support.workflows import linear_version_2
from workflows import (
    RunStatus,
    WorkflowScope,
    stage_workflow,
    start_workflow,
)
from workflows.exceptions import WorkflowIdentityConflict
from workflows.models import WorkflowRun
from workflows.testing import TestClock, run_workflow

pytestmark = pytest.mark.django_db

SCOPE = "tenant-identity"


def test_the_conflict_names_what_differs() -> None:
    start_workflow(SCOPE, "same-id", "checks.linear", {"start": 1}, version=1)
    runs = WorkflowRun.objects.count()
    with linear_version_2():
        cases = [
            ("checks.fanout", {"start": 1}, 1, "another name;"),
            ("checks.linear", {"start": 1}, 2, "another version;"),
            ("checks.linear", {"start": 2}, 1, "another input;"),
            ("checks.linear", {"start": 2}, 2, "another version, input;"),
        ]
        for name, input, version, said in cases:
            with pytest.raises(WorkflowIdentityConflict) as caught:
                start_workflow(SCOPE, "same-id", name, input, version=version)
            assert said in str(caught.value)
    assert WorkflowRun.objects.count() == runs
    snap = WorkflowScope(SCOPE).get("same-id")
    assert (snap.name, snap.version, snap.input) == ("checks.linear", 1, {"start": 1})


def test_a_retry_without_a_version_after_a_deploy_finds_the_run_it_started() -> None:
    first = start_workflow(SCOPE, "retried", "checks.linear", {"start": 1})
    assert first.version == 1
    runs = WorkflowRun.objects.count()
    with linear_version_2():
        again = start_workflow(SCOPE, "retried", "checks.linear", {"start": 1})
        with transaction.atomic():
            staged = stage_workflow(SCOPE, "retried", "checks.linear", {"start": 1})
        # Naming the new version is still another request.
        with pytest.raises(WorkflowIdentityConflict, match="another version;"):
            start_workflow(SCOPE, "retried", "checks.linear", {"start": 1}, version=2)
        with pytest.raises(WorkflowIdentityConflict, match="another input;"):
            start_workflow(SCOPE, "retried", "checks.linear", {"start": 2})
        # A new run id takes the new version.
        fresh = start_workflow(SCOPE, "after-deploy", "checks.linear", {"start": 1})
    assert (again.created, again.version, staged.created, staged.version) == (False, 1, False, 1)
    assert fresh.version == 2
    assert WorkflowRun.objects.count() == runs + 1


def test_a_callers_run_with_a_childs_id_is_not_taken_as_the_child() -> None:
    # The caller started "p/kid" itself, with the very request the parent makes: had
    # the parent taken it as its child, nothing would ever wake the parent.
    start_workflow(SCOPE, "p/kid", "checks.linear", {"start": 10})
    start_workflow(SCOPE, "p", "checks.parent", {})
    snap = run_workflow(SCOPE, "p", clock=TestClock())
    assert snap.status == RunStatus.FAILED
    assert snap.error.startswith(
        "WorkflowIdentityConflict: run 'p/kid' exists in this scope and is not the child "
        "'kid' of run 'p'"
    )
    assert snap.failed_step == "kid"
    assert snap.steps == ()  # nothing recorded for the child checkpoint
    assert WorkflowScope(SCOPE).get("p/kid").parent_run_id is None
