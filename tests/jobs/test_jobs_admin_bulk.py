"""The jobs admin's "all N matching" actions: "Cancel" or "Retry" chosen with "Select
all N" shows a confirmation page with the dry run and changes nothing; "Yes" acts on
every job the filters match — and only those, none created after the count — by the
store's rules; the same permission as the actions on ticked rows."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.db.models import Max
from django.test import Client
from django.urls import reverse

from jobs import JobScope, JobSubmission, execution, submit_job
from jobs.models import Job
from jobs.types import JobStatus
from tests.support.bulk import across as support_across

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-admin-bulk"
CHANGELIST = reverse("admin:jobs_job_changelist")


def submit(job_id: str, *, handler: str = "reports.generate", max_attempts: int = 1) -> Any:
    return submit_job(SCOPE, job_id, JobSubmission.create(handler, {}, max_attempts=max_attempts))


def failed(job_id: str, **kwargs: Any) -> None:
    snap = submit(job_id, **kwargs)
    claim = execution.try_start(snap.scope_hash, job_id, "w1")
    assert claim is not None
    assert execution.fail(claim.token, "boom")


def running(job_id: str, **kwargs: Any) -> Any:
    snap = submit(job_id, **kwargs)
    claim = execution.try_start(snap.scope_hash, job_id, "w1")
    assert claim is not None
    return claim


def status(job_id: str) -> str:
    return Job.objects.get(job_id=job_id).status


def across(client: Client, query: str, action: str, **extra: Any) -> Any:
    """The action chosen for every job the filters in ``query`` match ("Select all N"),
    with the ticked row Django posts along."""
    return support_across(client, CHANGELIST, Job, action, query, **extra)


def largest_id() -> str:
    """What a dry run's page posts back as the largest id it counted: the largest id
    there is (ids keep growing over a test session, never from 1)."""
    return str(Job.objects.aggregate(largest=Max("id"))["largest"])


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.fixture
def failures() -> None:
    """Five failed jobs of two handlers (reports: no attempt left; mail: one left),
    and a queued and a running job."""
    for n in range(3):
        failed(f"report-{n}")
    for n in range(2):
        failed(f"mail-{n}", handler="mail.send", max_attempts=2)
    submit("waiting")
    running("busy")


def test_retry_all_matching_asks_first_with_the_dry_run_and_changes_nothing(
    admin_client, failures, unchanged
):
    with unchanged():
        response = across(admin_client, "status__exact=failed", "retry_jobs")

    assert response.status_code == 200
    page = response.content.decode()
    assert "Retry all 5 matching jobs?" in page
    assert "<li>Status: Failed</li>" in page
    preview = response.context["preview"]
    assert (preview.matched, dict(preview.changed)) == (5, {"re-queued": 2})
    assert preview.reasons["used all their attempts (grant more)"] == 3
    assert 'name="bulk_confirm"' in page
    assert 'name="extra_attempts"' in page


def test_count_again_with_extra_attempts_then_yes_retries_every_matching_job(
    admin_client, failures
):
    with_extra = across(
        admin_client, "status__exact=failed", "retry_jobs", bulk_recount="1", extra_attempts="1"
    )
    assert dict(with_extra.context["preview"].changed) == {"re-queued": 5}
    up_to = with_extra.context["up_to"]

    done = across(
        admin_client,
        "status__exact=failed",
        "retry_jobs",
        bulk_confirm="1",
        extra_attempts="1",
        bulk_up_to=str(up_to),
    )

    assert done.status_code == 302
    assert done["Location"].endswith("?status__exact=failed")
    (message,) = messages_of(done)
    assert message.startswith(
        "5 jobs matched: changed 5 (5 re-queued), skipped 0 (their state did not allow it); "
        "1 batch(es) in "
    )
    assert {j.job_id: j.status for j in Job.objects.all()} == {
        **{f"report-{n}": JobStatus.QUEUED for n in range(3)},
        **{f"mail-{n}": JobStatus.QUEUED for n in range(2)},
        "waiting": JobStatus.QUEUED,
        "busy": JobStatus.RUNNING,
    }
    assert Job.objects.get(job_id="report-0").max_attempts == 2


def test_yes_acts_on_the_jobs_counted_not_on_those_created_since(admin_client, failures):
    page = across(admin_client, "status__exact=failed&handler__exact=mail.send", "retry_jobs")
    up_to = page.context["up_to"]
    failed("mail-late", handler="mail.send", max_attempts=2)

    across(
        admin_client,
        "status__exact=failed&handler__exact=mail.send",
        "retry_jobs",
        bulk_confirm="1",
        extra_attempts="0",
        bulk_up_to=str(up_to),
    )

    assert [status(f"mail-{n}") for n in range(2)] == [JobStatus.QUEUED] * 2
    assert status("mail-late") == JobStatus.FAILED
    assert {status(f"report-{n}") for n in range(3)} == {JobStatus.FAILED}


def test_cancel_all_matching_follows_the_rules_for_each_job(admin_client, failures):
    page = across(admin_client, "", "cancel_jobs")
    assert "Cancel all 7 matching jobs?" in page.content.decode()
    assert dict(page.context["preview"].changed) == {"cancelled": 1, "cancel requested": 1}

    done = across(
        admin_client, "", "cancel_jobs", bulk_confirm="1", bulk_up_to=str(page.context["up_to"])
    )

    assert done.status_code == 302
    assert messages_of(done)[0].startswith(
        "7 jobs matched: changed 2 (1 cancelled, 1 cancel requested), skipped 5"
    )
    assert status("waiting") == JobStatus.CANCELLED
    busy = Job.objects.get(job_id="busy")
    assert (busy.status, busy.cancel_requested) == (JobStatus.RUNNING, True)
    assert {status(f"report-{n}") for n in range(3)} == {JobStatus.FAILED}


def test_the_search_is_part_of_the_filter(admin_client, failures):
    submit_job("someone-else", "other-failed", JobSubmission.create("reports.generate", {}))
    page = across(admin_client, f"q={SCOPE}", "cancel_jobs")
    assert page.context["preview"].matched == 7
    assert ("search", SCOPE) in page.context["filters"]
    across(admin_client, f"q={SCOPE}", "cancel_jobs", bulk_confirm="1",
           bulk_up_to=str(page.context["up_to"]))  # fmt: skip
    assert status("other-failed") == JobStatus.QUEUED


def test_bad_options_show_the_page_again_and_change_nothing(admin_client, failures, unchanged):
    with unchanged():
        response = across(
            admin_client,
            "status__exact=failed",
            "retry_jobs",
            bulk_confirm="1",
            extra_attempts="-1",
            bulk_up_to=largest_id(),
        )
    assert response.status_code == 200
    assert "greater than or equal to 0" in response.content.decode()


def test_a_confirmation_without_the_count_counts_again_and_changes_nothing(
    admin_client, failures, unchanged
):
    with unchanged():
        response = across(admin_client, "status__exact=failed", "retry_jobs", bulk_confirm="1")
    assert response.status_code == 200
    assert response.context["preview"].matched == 5


def test_staff_who_may_only_view_cannot_act_on_all_matching(django_user_model, failures, unchanged):
    user = django_user_model.objects.create_user("viewer", password="unused", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client = Client()
    client.force_login(user)

    with unchanged():
        page = across(client, "status__exact=failed", "retry_jobs")
        done = across(
            client,
            "status__exact=failed",
            "retry_jobs",
            bulk_confirm="1",
            extra_attempts="1",
            bulk_up_to=largest_id(),
        )

    # Django offers them no action: the posts show the list again.
    for response in (page, done):
        assert "Retry all" not in response.content.decode()
        assert "preview" not in response.context


def test_ticked_rows_are_still_acted_on_one_by_one(admin_client, failures):
    response = admin_client.post(
        CHANGELIST,
        {
            "action": "retry_jobs",
            "index": "0",
            "_selected_action": [Job.objects.get(job_id="report-0").pk],
        },
    )
    assert response.status_code == 302
    assert status("report-0") == JobStatus.QUEUED
    assert status("report-1") == JobStatus.FAILED
    assert JobScope(SCOPE).get("report-0").max_attempts == 2
