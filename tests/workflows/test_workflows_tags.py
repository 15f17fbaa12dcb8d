"""A run's tags: kept on the run as given, shown on its snapshot and in the admin,
and found by ``WorkflowScope.list(tags=...)`` (a run matches when it carries every
pair) and by the admin's search; anything but string pairs, or more than 16, is a
typed error that writes nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.urls import reverse

from jobs.models import Job
from workflows import WorkflowScope, stage_workflow, start_workflow
from workflows.exceptions import InvalidInput, WorkflowIdentityConflict
from workflows.models import WorkflowRun
from workflows.testing import run_workflow

pytestmark = pytest.mark.django_db

SCOPE = "tenant-tags"


@pytest.fixture
def tagged() -> None:
    start_workflow(SCOPE, "a", "checks.signals", {}, tags={"customer": "42", "region": "eu"})
    start_workflow(SCOPE, "b", "checks.signals", {}, tags={"customer": "42", "region": "us"})
    start_workflow(SCOPE, "c", "checks.signals", {}, tags={"customer": "7"})
    start_workflow(SCOPE, "d", "checks.signals", {})
    # Another scope's run carrying the same pair is never listed here.
    start_workflow("elsewhere", "e", "checks.signals", {}, tags={"customer": "42"})


def listed(**tags: str) -> list[str]:
    return [run.run_id for run in WorkflowScope(SCOPE).list(tags=tags)]


def test_the_tags_are_kept_on_the_run_and_its_snapshot(tagged):
    assert WorkflowScope(SCOPE).get("a").tags == {"customer": "42", "region": "eu"}
    assert WorkflowScope(SCOPE).get("d").tags == {}
    assert WorkflowRun.objects.get(run_id="c").tags == {"customer": "7"}


def test_a_run_is_listed_when_it_carries_every_pair_asked_for(tagged):
    assert listed(customer="42") == ["a", "b"]
    assert listed(customer="42", region="us") == ["b"]
    assert listed(customer="4") == []
    assert listed(region="eu", customer="7") == []
    assert listed() == ["a", "b", "c", "d"]
    scope = WorkflowScope(SCOPE)
    assert [r.run_id for r in scope.list(status="waiting", tags={"customer": "42"}, limit=1)] == [
        "a"
    ]


def test_a_key_holding_the_lookup_separator_is_one_key():
    start_workflow(SCOPE, "odd", "checks.signals", {}, tags={"a__b": "x", 'q"uote': "y"})
    assert listed(**{"a__b": "x", 'q"uote': "y"}) == ["odd"]
    assert listed(a="x") == []


def test_the_same_run_id_with_other_tags_is_a_conflict(tagged):
    assert not start_workflow(
        SCOPE, "a", "checks.signals", {}, tags={"region": "eu", "customer": "42"}
    ).created
    with pytest.raises(WorkflowIdentityConflict, match="tags"):
        start_workflow(SCOPE, "a", "checks.signals", {}, tags={"customer": "43"})


BAD_TAGS = [
    ({"customer": 42}, "must be a str, not int"),
    ({42: "x"}, "must be a str, not int"),
    ({"": "x"}, "must not be empty"),
    ({"k": "\x00"}, "control characters"),
    ({"k" * 101: "x"}, "at most 100 characters"),
    ({"k": "v" * 201}, "at most 200 characters"),
    ({f"k{n}": "v" for n in range(17)}, "17 pairs, more than the 16"),
    ([("customer", "42")], "must be a dict"),
    ("customer=42", "must be a dict"),
]


@pytest.mark.parametrize(("tags", "message"), BAD_TAGS)
def test_bad_tags_are_a_typed_error_that_writes_nothing(tags, message):
    with pytest.raises(InvalidInput, match=message):
        start_workflow(SCOPE, "bad", "checks.signals", {}, tags=tags)
    with pytest.raises(InvalidInput, match=message), transaction.atomic():
        stage_workflow(SCOPE, "bad", "checks.signals", {}, tags=tags)
    with pytest.raises(InvalidInput, match=message):
        WorkflowScope(SCOPE).list(tags=tags)
    assert not WorkflowRun.objects.exists()
    assert not Job.objects.exists()


def test_sixteen_pairs_are_the_most_a_run_carries():
    tags = {f"k{n}": "v" for n in range(16)}
    start_workflow(SCOPE, "full", "checks.signals", {}, tags=tags)
    assert listed(**tags) == ["full"]


CHANGELIST = reverse("admin:workflows_workflowrun_changelist")


def found(client: Any, term: str) -> list[str]:
    page = client.get(CHANGELIST, {"q": term})
    assert page.status_code == 200
    return sorted(run.run_id for run in page.context["cl"].result_list)


def test_the_admin_shows_the_tags_and_finds_runs_by_them(admin_client, tagged):
    assert found(admin_client, "customer=42") == ["a", "b", "e"]
    assert found(admin_client, "customer=42, region=eu") == ["a"]
    assert found(admin_client, "c") == ["c"]  # a run id, exactly
    assert found(admin_client, "customer=") == []
    page = admin_client.get(CHANGELIST, {"q": "region=eu"})
    assert "customer=42, region=eu" in page.content.decode()
    run = WorkflowRun.objects.get(run_id="b")
    detail = admin_client.get(reverse("admin:workflows_workflowrun_change", args=[run.pk]))
    assert "customer=42, region=us" in detail.content.decode()


def test_a_fork_carries_the_tags_of_the_run_it_forks():
    start_workflow(SCOPE, "source", "checks.linear", {"start": 1}, tags={"customer": "42"})
    run_workflow(SCOPE, "source")

    WorkflowScope(SCOPE).fork("source", "source-again", from_step="b")

    assert WorkflowScope(SCOPE).get("source-again").tags == {"customer": "42"}
    assert listed(customer="42") == ["source", "source-again"]
