"""``manage.py bulk_workflows cancel|resume``, the admin's "all N matching" actions on
runs, and the store's ``cancel_runs_many``/``resume_runs_many`` under them: every run
a filter matches and only those change, exactly as one run's cancel and resume change
it (the same rows, the same advance jobs, the same end once driven); a dry run
changes nothing; bad input is refused before anything is written; on PostgreSQL a
batch never waits for a run another transaction holds."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.core.management import CommandError
from django.urls import reverse

from jobs.models import Job
from jobs.types import JobStatus
from ledon.bulk import BulkFilter, run_bulk
from testproject.workflow_checks import tasks as checks
from tests.support.bulk import Row, held, run_command, table
from tests.support.bulk import across as support_across
from workflows import RunStatus, WorkflowScope, send_signal, start_workflow, store
from workflows import bulk as workflows_bulk
from workflows.exceptions import InvalidInput
from workflows.models import WorkflowRun, WorkflowStep
from workflows.store import many
from workflows.testing import run_workflow, run_workflows_inline

pytestmark = pytest.mark.django_db(transaction=True)

#: Two scopes that get the same runs: one is steered run by run through the scope's
#: API, the other by filter; they must end alike.
ONE_BY_ONE, BY_FILTER = "tenant-one", "tenant-bulk"


def world(scope: str) -> None:
    """Runs in every situation the operations tell apart, driven as far as they go:
    a failed step, a failed map, a parent whose child failed (Failed both), a
    succeeded run, a run waiting for a signal, a parent waiting for a child that
    waits for a signal."""
    start_workflow(scope, f"flaky-{scope}", "checks.flaky", {"fail_times": 1, "retries": 0})
    start_workflow(scope, "map", "checks.failing_map")
    start_workflow(scope, "parent", "checks.parent", {"child": "checks.flaky"})
    start_workflow(scope, "linear", "checks.linear", {"start": 1})
    start_workflow(scope, "waiting", "checks.signals", {})
    start_workflow(scope, "nest", "checks.parent", {"child": "checks.signals"})
    run_workflows_inline()
    # The map's items are tried again after a back-off: the test clock moves to it.
    assert run_workflow(scope, "map").status == RunStatus.FAILED


def picture(scope: str) -> dict[str, Any]:
    """Everything the rules speak of, per run (its id without the scope's mark): the
    run's row, its checkpoints, and its queued advance jobs."""
    runs = {}
    for run in WorkflowRun.objects.for_scope(WorkflowScope(scope).scope_hash).order_by("pk"):
        steps = WorkflowStep.objects.filter(run=run).order_by("pk")
        advances = Job.objects.filter(
            scope_hash=store.advance_scope_hash(),
            job_id__startswith=store.advance_job_prefix(run.pk),
            status=JobStatus.QUEUED,
        )
        runs[run.run_id.replace(f"-{scope}", "")] = {
            "row": (
                run.status,
                run.generation,
                run.rerun_keys,
                run.error,
                run.failed_step,
                run.wait_kind,
                run.wait_key,
                run.cancel_requested,
                run.finished_at is None,
            ),
            "steps": [(s.key, s.kind, s.status, s.error) for s in steps],
            "advances": sorted(
                j.removeprefix(store.advance_job_prefix(run.pk))
                for j in advances.values_list("job_id", flat=True)
            ),
        }
    return runs


def bulk_workflows(*args: str) -> str:
    return run_command("bulk_workflows", *args)


@pytest.fixture
def both() -> None:
    world(ONE_BY_ONE)
    world(BY_FILTER)
    assert picture(ONE_BY_ONE).keys() == picture(BY_FILTER).keys()


def one_by_one(status: RunStatus, steer: str) -> None:
    scope = WorkflowScope(ONE_BY_ONE)
    for run_id in (
        WorkflowRun.objects.for_scope(scope.scope_hash)
        .order_by("pk")
        .values_list("run_id", flat=True)
    ):
        if WorkflowRun.objects.for_scope(scope.scope_hash).get(run_id=run_id).status == status:
            getattr(scope, steer)(run_id)


def test_a_resume_by_filter_changes_the_runs_as_resuming_each_does(both):
    failed = WorkflowRun.objects.for_scope(WorkflowScope(BY_FILTER).scope_hash).filter(
        status=RunStatus.FAILED
    )
    assert failed.count() == 4  # flaky, map, parent and its child
    other_scope = picture(ONE_BY_ONE)

    out = bulk_workflows("resume", "--status", "failed", "--scope", BY_FILTER, "--batch-size", "2")

    # The child was resumed with its parent: its own turn finds it Waiting.
    assert "4 run(s) matched: changed 3 (3 resumed), skipped 1" in out
    assert picture(ONE_BY_ONE) == other_scope, "only the filtered scope changes"
    one_by_one(RunStatus.FAILED, "resume")
    assert picture(BY_FILTER) == picture(ONE_BY_ONE)
    assert picture(BY_FILTER)["flaky"]["advances"] == ["1:resume"]

    run_workflows_inline()  # the flaky step's second try succeeds
    assert picture(BY_FILTER) == picture(ONE_BY_ONE)
    assert WorkflowScope(BY_FILTER).get(f"flaky-{BY_FILTER}").status == RunStatus.SUCCEEDED


def test_a_cancel_by_filter_changes_the_runs_as_cancelling_each_does(both):
    out = bulk_workflows("cancel", "--scope", BY_FILTER, "--status", "waiting")

    # The waiting run, the nest and its child.
    assert "3 run(s) matched: changed 3 (3 cancelled, 0 cancel requested), skipped 0" in out
    one_by_one(RunStatus.WAITING, "cancel")
    assert picture(BY_FILTER) == picture(ONE_BY_ONE)
    nest = picture(BY_FILTER)
    assert nest["nest"]["row"][0] == nest["nest/kid"]["row"][0] == RunStatus.CANCELLED
    assert nest["nest"]["advances"] == [] == nest["waiting"]["advances"]

    run_workflows_inline()
    assert picture(BY_FILTER) == picture(ONE_BY_ONE)


def test_a_running_run_is_asked_to_stop_and_ends_cancelled_at_its_next_checkpoint():
    start_workflow(BY_FILTER, "waiting", "checks.signals", {})
    run_workflows_inline()
    run = WorkflowRun.objects.get(run_id="waiting")
    taken = store.take(run.pk, job_id=None)  # a driver holds it, as a worker would
    assert taken is not None

    report = run_bulk(
        workflows_bulk.matching(BulkFilter(name="checks.signals")),
        workflows_bulk.cancel_action(),
        error=InvalidInput,
    )

    assert report.changed == {many.CANCELLED: 0, many.CANCEL_REQUESTED: 1}
    run.refresh_from_db()
    assert (run.status, run.cancel_requested) == (RunStatus.RUNNING, True)


def test_a_dry_run_changes_nothing_and_counts_what_the_run_then_does(both):
    before = picture(BY_FILTER)

    out = bulk_workflows("resume", "--scope", BY_FILTER, "--dry-run")

    assert picture(BY_FILTER) == before
    assert "dry run: 8 run(s) match; would change 4 (4 resumed), would skip 4 (4 not failed)" in out
    out = bulk_workflows("cancel", "--scope", BY_FILTER, "--name", "checks.parent", "--dry-run")
    assert "would change 1 (1 cancelled, 0 cancel requested), would skip 1 (1 finished" in out
    assert picture(BY_FILTER) == before


def test_the_filters_select_by_name_error_and_creation_time(both):
    before = picture(ONE_BY_ONE)
    run = WorkflowRun.objects.get(run_id="map", scope_hash=WorkflowScope(BY_FILTER).scope_hash)
    since = run.created_at.isoformat()

    out = bulk_workflows(
        "resume",
        "--error-contains",
        "CANNOT TAKE",
        "--since",
        since,
        "--name",
        "checks.failing_map",
    )

    assert "1 run(s) matched: changed 1 (1 resumed)" in out
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING
    assert picture(ONE_BY_ONE) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["resume", "--status", "broken"], "--status must be one of"),
        (["resume", "--since", "yesterday"], "--since must be an ISO 8601"),
        (["cancel", "--since", "2026-03-02", "--until", "2026-03-01"], "must be before --until"),
        (["cancel", "--scope", "x", "--batch-size", "0"], "batch size must be between"),
        (["cancel"], "give at least one filter"),
    ],
)
def test_bad_input_is_refused_and_nothing_is_written(both, args, message):
    before = (picture(ONE_BY_ONE), picture(BY_FILTER))
    with pytest.raises(CommandError, match=message):
        bulk_workflows(*args)
    assert (picture(ONE_BY_ONE), picture(BY_FILTER)) == before


def test_a_batch_is_a_few_statements_however_many_runs(django_assert_max_num_queries):
    for n in range(40):
        start_workflow(BY_FILTER, f"flaky-{n}", "checks.flaky", {"fail_times": 1, "retries": 0})
    run_workflows_inline()
    ids = list(WorkflowRun.objects.filter(status=RunStatus.FAILED).values_list("pk", flat=True))
    assert len(ids) == 40

    with django_assert_max_num_queries(15):
        outcome = many.resume_runs_many(ids)

    assert outcome.changed == {many.RESUMED: 40}


@pytest.mark.postgres_only
def test_a_batch_does_not_wait_for_a_run_another_transaction_holds(background):
    for name in ("held", "free"):
        start_workflow(BY_FILTER, f"{name}-{BY_FILTER}", "checks.flaky", {"fail_times": 1})
    run_workflows_inline()
    with held(background, WorkflowRun.objects.filter(run_id=f"held-{BY_FILTER}")):
        report = run_bulk(
            workflows_bulk.matching(BulkFilter(status="failed")),
            workflows_bulk.resume_action(),
            error=InvalidInput,
        )

    assert (report.changed, report.held) == ({many.RESUMED: 1}, 1)
    scope = WorkflowScope(BY_FILTER)
    assert scope.get(f"held-{BY_FILTER}").status == RunStatus.FAILED
    assert scope.get(f"free-{BY_FILTER}").status == RunStatus.WAITING


CHANGELIST = reverse("admin:workflows_workflowrun_changelist")


def across(client: Any, action: str, query: str = "", **extra: Any) -> Any:
    return support_across(client, CHANGELIST, WorkflowRun, action, query, **extra)


def test_resume_all_matching_in_the_admin_shows_the_dry_run_then_resumes(admin_client, both):
    before = picture(BY_FILTER)

    page = across(admin_client, "resume_runs", "status__exact=failed")

    assert picture(BY_FILTER) == before
    assert "Resume all 8 matching workflow runs?" in page.content.decode()
    assert dict(page.context["preview"].changed) == {many.RESUMED: 8}

    done = across(
        admin_client,
        "resume_runs",
        "status__exact=failed",
        bulk_confirm="1",
        bulk_up_to=str(page.context["up_to"]),
    )

    assert done.status_code == 302
    [message] = [str(m) for m in get_messages(done.wsgi_request)]
    assert message.startswith("8 workflow runs matched: changed 6 (6 resumed), skipped 2")
    assert not WorkflowRun.objects.filter(status=RunStatus.FAILED).exists()


def test_cancel_all_matching_a_tag_search_in_the_admin(admin_client):
    for n, customer in enumerate(("42", "42", "7")):
        start_workflow(BY_FILTER, f"r{n}", "checks.signals", {}, tags={"customer": customer})
    run_workflows_inline()

    page = across(admin_client, "cancel_runs", "q=customer%3D42")
    assert "Cancel all 2 matching workflow runs?" in page.content.decode()
    across(
        admin_client,
        "cancel_runs",
        "q=customer%3D42",
        bulk_confirm="1",
        bulk_up_to=str(page.context["up_to"]),
    )

    statuses = dict(WorkflowRun.objects.values_list("run_id", "status"))
    assert statuses == {"r0": RunStatus.CANCELLED, "r1": RunStatus.CANCELLED, "r2": "waiting"}
    send_signal(BY_FILTER, "r2", "approved", "yes")
    run_workflows_inline()
    assert WorkflowScope(BY_FILTER).get("r2").output == "yes"


# --------------------------------------------------------------------------- tags

#: The tags of the runs of :func:`tagged`, each run in two scopes.
TAGGED = {
    "eu-42": {"customer": "42", "region": "eu"},
    "us-42": {"customer": "42", "region": "us"},
    "eu-7": {"customer": "7", "region": "eu"},
    "plain": {},
    "formula": {"expr": "a=b", "note": ""},
    "cased": {"Customer": "42"},
}


@pytest.fixture
def tagged() -> None:
    """Runs carrying the tags of :data:`TAGGED`, in two scopes: half wait for a
    signal, the other half failed (``-failed`` runs)."""
    for scope in (ONE_BY_ONE, BY_FILTER):
        checks.TRIES.clear()  # counted by run id: each scope's first try fails
        for run_id, tags in TAGGED.items():
            start_workflow(scope, run_id, "checks.signals", {}, tags=tags)
            start_workflow(
                scope, f"{run_id}-failed", "checks.flaky", {"fail_times": 1, "retries": 0},
                tags=tags,
            )  # fmt: skip
        run_workflows_inline()
    assert WorkflowRun.objects.filter(status=RunStatus.FAILED).count() == 2 * len(TAGGED)


def run_rows() -> dict[int, Row]:
    return table(WorkflowRun)


def listed(tags: dict[str, str]) -> set[int]:
    """The runs ``WorkflowScope.list(tags=...)`` finds, in every scope."""
    found = set()
    for scope in (ONE_BY_ONE, BY_FILTER):
        runs = {run.run_id for run in WorkflowScope(scope).list(tags=tags)}
        found |= set(
            WorkflowRun.objects.for_scope(WorkflowScope(scope).scope_hash)
            .filter(run_id__in=runs)
            .values_list("pk", flat=True)
        )
    return found


def tag_args(tags: dict[str, str]) -> list[str]:
    return [a for key, value in tags.items() for a in ("--tag", f"{key}={value}")]


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        ({"customer": "42"}, {"eu-42", "us-42"}),
        ({"customer": "42", "region": "eu"}, {"eu-42"}),
        ({"region": "eu"}, {"eu-42", "eu-7"}),
        ({"expr": "a=b"}, {"formula"}),  # split at the first "="
        ({"note": ""}, {"formula"}),  # an empty value is a value
        ({"Customer": "42"}, {"cased"}),  # keys and values exactly
        ({"customer": "42", "region": "asia"}, set()),
    ],
)
def test_tags_select_the_runs_that_carry_every_pair_as_the_scope_lists_them(tagged, tags, expected):
    before = run_rows()
    chosen = listed(tags)
    assert {before[pk]["run_id"].removesuffix("-failed") for pk in chosen} == expected

    out = bulk_workflows("cancel", *tag_args(tags))

    after = run_rows()
    for pk, row in before.items():
        if pk in chosen and row["status"] == RunStatus.WAITING:
            assert after[pk]["status"] == RunStatus.CANCELLED, row["run_id"]
        else:
            assert after[pk] == row, row["run_id"]
    waiting = sum(before[pk]["status"] == RunStatus.WAITING for pk in chosen)
    assert f"{len(chosen)} run(s) matched: changed {waiting} ({waiting} cancelled" in out
    first = ", ".join(f"tag {key}={value!r}" for key, value in tags.items())
    assert out.splitlines()[0] == f"bulk_workflows cancel: {first}"


def test_tags_narrow_the_other_filters_and_the_dry_run_changes_nothing(tagged):
    before = run_rows()
    args = ["--tag", "customer=42", "--scope", BY_FILTER, "--status", "failed"]

    dry = bulk_workflows("resume", *args, "--dry-run")

    assert run_rows() == before
    assert "dry run: 2 run(s) match; would change 2 (2 resumed), would skip 0;" in dry
    out = bulk_workflows("resume", *args)
    assert "2 run(s) matched: changed 2 (2 resumed), skipped 0" in out
    after = run_rows()
    resumed = {row["run_id"] for pk, row in after.items() if row != before[pk]}
    assert resumed == {"eu-42-failed", "us-42-failed"}
    scope = WorkflowScope(BY_FILTER)
    assert {run.run_id for run in scope.list(status="waiting", tags={"customer": "42"})} == {
        "eu-42",
        "us-42",
        "eu-42-failed",
        "us-42-failed",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tag", "customer"], "--tag must be KEY=VALUE"),
        (["--tag", "customer=42", "--tag", "customer=7"], "'customer' is given twice"),
        (["--tag", "=42"], "a tag's key must not be empty"),
        (["--tag", f"{'k' * 101}=1"], "a tag's key must be at most 100 characters"),
        (["--tag", f"customer={'4' * 201}"], "tag 'customer' must be at most 200 characters"),
        (["--tag", "customer=4\t2"], "tag 'customer' must not contain control characters"),
        (["--tag", "customer=4\udcff2"], "tag 'customer' contains a lone surrogate"),
        ([a for n in range(17) for a in ("--tag", f"k{n}=v")], "17 pairs, more than the 16"),
    ],
)
def test_bad_tags_are_refused_and_nothing_is_written(tagged, args, message):
    before = run_rows()
    with pytest.raises(CommandError, match=message):
        bulk_workflows("cancel", *args)
    assert run_rows() == before
    # The scope's list refuses the same tags the same way.
    tags = dict(a.partition("=")[::2] for a in args[1::2])
    if "KEY=VALUE" not in message and "twice" not in message:
        with pytest.raises(InvalidInput, match=message):
            WorkflowScope(BY_FILTER).list(tags=tags)


def test_jobs_carry_no_tags():
    from jobs import bulk as jobs_bulk
    from jobs.exceptions import InvalidInput as JobsInvalidInput

    with pytest.raises(JobsInvalidInput, match="jobs carry no tags"):
        jobs_bulk.matching(BulkFilter(tags={"customer": "42"}))
    with pytest.raises(CommandError, match="unrecognized arguments: --tag"):
        run_command("bulk_jobs", "cancel", "--tag", "customer=42")
