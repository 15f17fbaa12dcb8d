"""The jobs admin: read-only pages, filters and search, and the cancel and retry
actions, which change state only through the store and only for users allowed to."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils.html import escape

from jobs import JobScope, JobSnapshot, JobStatus, JobSubmission, execution, submit_job
from jobs.execution import Claim, ExecutionStatus, FinishOutcome
from jobs.models import Job, JobAttempt, Queue

# submit_job runs in a transaction of its own and refuses an ambient one.
pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-admin"
OTHER_SCOPE = "tenant-other"
WORKER = "admin-test-worker"
CHANGELIST = "admin:jobs_job_changelist"

needs_change_form_actions = pytest.mark.skipif(
    not hasattr(admin, "ActionLocation"), reason="actions on the change form need Django 6.1"
)


def submit(
    job_id: str,
    payload: Any = None,
    *,
    scope: str = SCOPE,
    handler: str = "reports.generate",
    queue: str = "default",
    max_attempts: int = 3,
) -> JobSnapshot:
    sub = JobSubmission.create(
        handler, payload or {}, version=1, queue=queue, max_attempts=max_attempts
    )
    return submit_job(scope, job_id, sub)


def start(snap: JobSnapshot) -> Claim:
    claim = execution.try_start(snap.scope_hash, snap.job_id, worker_id=WORKER)
    assert claim is not None, f"{snap.job_id} could not be started"
    return claim


def running(job_id: str, **kwargs: Any) -> Claim:
    return start(submit(job_id, **kwargs))


def succeeded(job_id: str, **kwargs: Any) -> None:
    assert execution.complete(running(job_id, **kwargs).token, "out/ref") is FinishOutcome.SUCCEEDED


def failed(job_id: str, **kwargs: Any) -> None:
    assert execution.fail(running(job_id, **kwargs).token, "boom") is FinishOutcome.FAILED


def job(job_id: str, scope: str = SCOPE) -> Job:
    return Job.objects.get(scope_hash=JobScope(scope).scope_hash, job_id=job_id)


def listed(client: Client, **params: str) -> set[str]:
    response = client.get(reverse(CHANGELIST), params)
    assert response.status_code == 200
    return {j.job_id for j in response.context["cl"].result_list}


def run_action(client: Client, action: str, *job_ids: str) -> list[str]:
    response = client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": [job(j).pk for j in job_ids]},
    )
    assert response.status_code == 302
    return [str(m) for m in get_messages(response.wsgi_request)]


@pytest.fixture
def staff_client(django_user_model: Any) -> Any:
    """A logged-in staff user given exactly the permissions passed in."""

    def make(*codenames: str) -> Client:
        user = django_user_model.objects.create_user(
            f"staff-{'-'.join(codenames)}", password="unused", is_staff=True
        )
        perms = Permission.objects.filter(content_type__app_label="jobs", codename__in=codenames)
        assert perms.count() == len(codenames)
        user.user_permissions.add(*perms)
        client = Client()
        client.force_login(user)
        return client

    return make


# --------------------------------------------------------------------------- list


def test_changelist_shows_each_job_with_its_columns(admin_client: Client) -> None:
    submit("queued-job", queue="reports")
    claim = running("running-job", max_attempts=3)
    assert execution.report_progress(claim.token, 40, "halfway")

    response = admin_client.get(reverse(CHANGELIST))

    assert response.status_code == 200
    content = response.content.decode()
    for expected in ("queued-job", "running-job", "reports.generate@1", "1/3", "0/3", "40%"):
        assert expected in content
    assert claim.token not in content
    assert "Cancel selected jobs" in content
    assert "Retry selected jobs" in content


def test_a_succeeded_job_shows_it_is_done_not_its_last_progress(admin_client: Client) -> None:
    claim = running("finished-early")
    assert execution.report_progress(claim.token, 10, "starting")
    assert execution.complete(claim.token)
    job = Job.objects.get(job_id="finished-early")

    listed = admin_client.get(reverse(CHANGELIST)).content.decode()
    page = admin_client.get(reverse("admin:jobs_job_change", args=[job.pk])).content.decode()
    for content in (listed, page):
        assert "10%" not in content
        assert "100%" in content
    assert "Handler unknown since" in page  # the unknown-handler window, shown to operators


def test_running_job_with_a_cancel_request_says_so(admin_client: Client) -> None:
    running("asked-to-stop")
    JobScope(SCOPE).cancel("asked-to-stop")

    content = admin_client.get(reverse(CHANGELIST)).content.decode()

    assert "Running (cancel requested)" in content


def test_filters_by_status_queue_handler_and_cancel_flag(admin_client: Client) -> None:
    submit("q-default")
    submit("q-mail", queue="mail", handler="mail.send")
    failed("f-default")
    running("r-cancel")
    JobScope(SCOPE).cancel("r-cancel")

    assert listed(admin_client, status__exact="failed") == {"f-default"}
    assert listed(admin_client, status__exact="queued") == {"q-default", "q-mail"}
    assert listed(admin_client, queue__exact="mail") == {"q-mail"}
    assert listed(admin_client, handler__exact="mail.send") == {"q-mail"}
    assert listed(admin_client, cancel_requested__exact="1") == {"r-cancel"}


def test_the_jobs_of_library_handlers_are_hidden_unless_shown(admin_client, handler) -> None:
    handler("lib.plumbing", library=True)(lambda ctx: None)
    handler("app.work")(lambda ctx: None)
    submit("plumbing-1", handler="lib.plumbing")
    failed("plumbing-2", handler="lib.plumbing")
    submit("work-1", handler="app.work")
    failed("work-2", handler="app.work")

    assert listed(admin_client) == {"work-1", "work-2"}
    assert listed(admin_client, status__exact="failed") == {"work-2"}
    assert listed(admin_client, engine="shown") == {"plumbing-1", "plumbing-2", "work-1", "work-2"}
    assert listed(admin_client, engine="shown", status__exact="failed") == {"plumbing-2", "work-2"}
    # A library handler chosen in the handler filter is listed.
    assert listed(admin_client, handler__exact="lib.plumbing") == {"plumbing-1", "plumbing-2"}
    page = admin_client.get(reverse(CHANGELIST)).content.decode()
    assert "By engine jobs" in page
    assert "?engine=shown" in page


def test_search_by_job_id_scope_hash_and_scope(admin_client: Client) -> None:
    submit("report-2026-11")
    submit("report-2026-12")
    submit("invoice-17")
    submit("invoice-18", scope=OTHER_SCOPE)
    other_hash = JobScope(OTHER_SCOPE).scope_hash

    assert listed(admin_client, q="report-2026") == {"report-2026-11", "report-2026-12"}
    assert listed(admin_client, q="invoice") == {"invoice-17", "invoice-18"}
    assert listed(admin_client, q=other_hash) == {"invoice-18"}
    assert listed(admin_client, q=other_hash.upper()) == {"invoice-18"}
    assert listed(admin_client, q=OTHER_SCOPE) == {"invoice-18"}
    # A scope is matched exactly: its prefix names no scope and no job id.
    assert listed(admin_client, q=other_hash[:20]) == set()


def test_search_by_a_scope_name_finds_the_reserved_scope_of_that_name(admin_client) -> None:
    execution.reserved_scope("periodic").submit("nightly@1", JobSubmission.create("x.y"))
    submit("tenant-job", scope="periodic")
    assert listed(admin_client, q="periodic") == {"nightly@1", "tenant-job"}


# --------------------------------------------------------------------------- job page


def test_job_page_shows_pretty_escaped_payload_and_attempts(admin_client: Client) -> None:
    payload = {"month": "2026-11", "lines": [1, 2], "note": "<b>bold</b> & café"}
    snap = submit("with-payload", payload)
    first = start(snap)
    assert execution.fail(first.token, "first <failure>") is FinishOutcome.FAILED
    JobScope(SCOPE).retry("with-payload")
    second = start(snap)

    response = admin_client.get(reverse("admin:jobs_job_change", args=[job("with-payload").pk]))

    assert response.status_code == 200
    content = response.content.decode()
    pretty = json.dumps(payload, indent=2, ensure_ascii=False)
    assert f'<pre class="jobs-payload">{escape(pretty)}</pre>' in content
    assert "<b>bold</b>" not in content
    # The attempts inline: both attempts, read-only, without their tokens.
    attempts = response.context["inline_admin_formsets"][0]
    assert [a.original.number for a in attempts] == [1, 2]
    assert "first &lt;failure&gt;" in content
    assert WORKER in content
    assert first.token not in content
    assert second.token not in content


def test_job_page_is_view_only_and_nothing_is_editable(admin_client: Client) -> None:
    submit("untouchable")
    pk = job("untouchable").pk
    change_url = reverse("admin:jobs_job_change", args=[pk])

    response = admin_client.get(change_url)
    content = response.content.decode()
    assert "View job" in content
    assert 'name="_save"' not in content
    assert 'name="queue"' not in content
    attempts = response.context["inline_admin_formsets"][0]
    assert not attempts.has_add_permission
    assert not attempts.has_change_permission
    assert not attempts.has_delete_permission

    assert admin_client.post(change_url, {"queue": "hacked"}).status_code == 403
    assert admin_client.get(reverse("admin:jobs_job_add")).status_code == 403
    assert admin_client.get(reverse("admin:jobs_job_delete", args=[pk])).status_code == 403
    assert job("untouchable").queue == "default"
    assert "Delete selected" not in admin_client.get(reverse(CHANGELIST)).content.decode()


# --------------------------------------------------------------------------- actions


def test_cancel_action_reports_each_outcome(admin_client: Client) -> None:
    submit("to-cancel")
    claim = running("to-ask")
    succeeded("done-already")

    messages = run_action(admin_client, "cancel_jobs", "to-cancel", "to-ask", "done-already")

    assert messages == ["1 cancelled, 1 cancel requested, 1 already finished."]
    assert job("to-cancel").status == JobStatus.CANCELLED
    assert job("to-cancel").attempt_count == 0
    asked = job("to-ask")
    assert (asked.status, asked.cancel_requested) == (JobStatus.RUNNING, True)
    assert job("done-already").status == JobStatus.SUCCEEDED
    # The running handler is told; its late completion records Cancelled.
    assert execution.get_execution_status(claim.token) is ExecutionStatus.CANCEL_REQUESTED
    assert execution.complete(claim.token, "late") is FinishOutcome.CANCELLED
    assert job("to-ask").result_ref is None


def test_cancel_action_on_finished_jobs_only_warns(admin_client: Client) -> None:
    succeeded("done-1")
    failed("done-2")

    response = admin_client.post(
        reverse(CHANGELIST),
        {"action": "cancel_jobs", "_selected_action": [job("done-1").pk, job("done-2").pk]},
        follow=True,
    )

    [message] = response.context["messages"]
    assert str(message) == "2 already finished."
    assert message.level_tag == "warning"


def test_retry_action_requeues_and_lists_refusals(admin_client: Client) -> None:
    failed("retry-me")
    running("still-running")
    failed("exhausted", max_attempts=1)

    messages = run_action(admin_client, "retry_jobs", "retry-me", "still-running", "exhausted")

    assert messages[0] == (
        "2 re-queued (1 with one extra attempt granted, having used all of theirs), 1 refused."
    )
    assert messages[1:] == [
        "Job 'still-running' is running; only failed, cancelled or interrupted jobs "
        "can be retried.",
    ]
    requeued = job("retry-me")
    assert requeued.status == JobStatus.QUEUED
    assert (requeued.error, requeued.current_token, requeued.finished_at) == ("", None, None)
    assert requeued.attempt_count == 1
    assert JobAttempt.objects.filter(job=requeued).count() == 1  # earlier attempts stay
    assert job("still-running").status == JobStatus.RUNNING
    # The operator's retry is the grant of one more attempt to a job that used its own.
    exhausted = job("exhausted")
    assert (exhausted.status, exhausted.max_attempts) == (JobStatus.QUEUED, 2)
    assert job("retry-me").max_attempts == 3


def test_retry_action_requeues_a_job_cancelled_while_queued(admin_client: Client) -> None:
    submit("cancelled-early")
    JobScope(SCOPE).cancel("cancelled-early")

    assert run_action(admin_client, "retry_jobs", "cancelled-early") == ["1 re-queued."]
    assert job("cancelled-early").status == JobStatus.QUEUED


@needs_change_form_actions
def test_actions_run_from_the_job_page(admin_client: Client) -> None:
    failed("retry-here")
    pk = job("retry-here").pk
    change_url = reverse("admin:jobs_job_change", args=[pk])
    assert "Retry selected jobs" in admin_client.get(change_url).content.decode()

    response = admin_client.post(
        change_url, {"CHANGE_FORM-action": "retry_jobs", "_selected_action": str(pk)}
    )

    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == ["1 re-queued."]
    assert job("retry-here").status == JobStatus.QUEUED


# --------------------------------------------------------------------------- permissions


def test_view_only_staff_sees_pages_but_no_actions(staff_client: Any) -> None:
    client = staff_client("view_job", "view_jobattempt")
    submit("look-only")
    pk = job("look-only").pk

    response = client.get(reverse(CHANGELIST))
    assert response.status_code == 200
    content = response.content.decode()
    assert "look-only" in content
    assert 'name="action"' not in content
    assert "Cancel selected jobs" not in content

    page = client.get(reverse("admin:jobs_job_change", args=[pk]))
    assert page.status_code == 200
    assert "Cancel selected jobs" not in page.content.decode()


def test_view_only_staff_cannot_run_actions(staff_client: Any) -> None:
    client = staff_client("view_job", "view_jobattempt")
    submit("keep-queued")
    failed("keep-failed")

    for action, job_id in (("cancel_jobs", "keep-queued"), ("retry_jobs", "keep-failed")):
        pk = job(job_id).pk
        response = client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [pk]})
        assert response.status_code == 200  # the list again: no such action for this user
        assert list(get_messages(response.wsgi_request)) == []
        change_url = reverse("admin:jobs_job_change", args=[pk])
        form_post = client.post(
            change_url, {"CHANGE_FORM-action": action, "_selected_action": str(pk)}
        )
        assert form_post.status_code == 403

    assert job("keep-queued").status == JobStatus.QUEUED
    assert job("keep-failed").status == JobStatus.FAILED


def test_change_permission_grants_the_actions(staff_client: Any) -> None:
    client = staff_client("view_job", "change_job")
    submit("steerable")

    assert "Cancel selected jobs" in client.get(reverse(CHANGELIST)).content.decode()
    assert run_action(client, "cancel_jobs", "steerable") == ["1 cancelled."]
    assert job("steerable").status == JobStatus.CANCELLED


def test_staff_without_view_permission_is_refused(staff_client: Any) -> None:
    client = staff_client("view_jobattempt")

    assert client.get(reverse(CHANGELIST)).status_code == 403


# --------------------------------------------------------------------------- attempts


def test_attempt_pages_are_read_only(admin_client: Client) -> None:
    claim = running("attempted")
    attempt = JobAttempt.objects.get(job=job("attempted"), number=1)

    listing = admin_client.get(reverse("admin:jobs_jobattempt_changelist"))
    assert listing.status_code == 200
    content = listing.content.decode()
    assert reverse("admin:jobs_job_change", args=[job("attempted").pk]) in content
    assert WORKER in content
    assert claim.token not in content

    page = admin_client.get(reverse("admin:jobs_jobattempt_change", args=[attempt.pk]))
    assert page.status_code == 200
    assert "View job attempt" in page.content.decode()
    assert claim.token not in page.content.decode()
    assert admin_client.get(reverse("admin:jobs_jobattempt_add")).status_code == 403
    delete_url = reverse("admin:jobs_jobattempt_delete", args=[attempt.pk])
    assert admin_client.get(delete_url).status_code == 403


# --------------------------------------------------------------------------- queues


def test_queue_admin_lists_depth_and_limits_and_pauses_for_who_may_steer(
    staff_client: Any, settings: Any
) -> None:
    settings.JOBS = {"QUEUES": {"emails": {"max_running": 4, "rate": (10, 1)}}}
    submit("mail-1", queue="emails")
    submit("mail-2", queue="emails")
    assert execution.pause_queue("emails")
    assert execution.resume_queue("emails")
    queue_changelist = reverse("admin:jobs_queue_changelist")
    viewer = staff_client("view_queue")
    page = viewer.get(queue_changelist).content.decode()
    assert "emails" in page
    assert "max_running=4, rate=10/1s" in page
    assert "Pause selected queues" not in page
    pk = Queue.objects.get(name="emails").pk
    refused = viewer.post(queue_changelist, {"action": "pause_queues", "_selected_action": [pk]})
    assert refused.status_code == 200
    assert not Queue.objects.get(name="emails").paused

    steerer = staff_client("view_queue", "change_queue")
    response = steerer.post(queue_changelist, {"action": "pause_queues", "_selected_action": [pk]})
    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == ["1 queue(s) paused."]
    assert Queue.objects.get(name="emails").paused
    assert execution.claim_due("w", limit=5) == []


def test_a_snoozed_attempt_shows_in_the_job_page(admin_client: Client) -> None:
    claim = running("snoozer")
    assert execution.snooze(claim.token, claim.lease_expires_at) is FinishOutcome.SNOOZED
    page = admin_client.get(reverse("admin:jobs_job_change", args=[job("snoozer").pk]))
    content = page.content.decode()
    assert "Snoozed" in content
    assert "0/3 (+1 snoozed)" in content


# --------------------------------------------------------------------------- fair share


def test_a_scope_weight_is_set_through_the_store_by_who_may(staff_client: Any) -> None:
    from jobs.models import ScopeWeight

    setter = reverse("admin:jobs_scopeweight_set")
    viewer = staff_client("view_scopeweight")
    assert (
        "Set a scope"
        not in viewer.get(reverse("admin:jobs_scopeweight_changelist")).content.decode()
    )
    assert viewer.get(setter).status_code == 403
    assert viewer.post(setter, {"scope": SCOPE, "weight": "3"}).status_code == 403
    assert not ScopeWeight.objects.exists()

    editor = staff_client("view_scopeweight", "change_scopeweight")
    assert (
        "Set a scope" in editor.get(reverse("admin:jobs_scopeweight_changelist")).content.decode()
    )
    refused = editor.post(setter, {"scope": SCOPE, "weight": "250"})
    assert refused.status_code == 200  # the form again, with its error
    assert "(0, 100]" in refused.content.decode()
    assert not ScopeWeight.objects.exists()

    assert editor.post(setter, {"scope": SCOPE, "weight": "3"}).status_code == 302
    row = ScopeWeight.objects.get()
    assert (row.scope_hash, row.weight) == (JobScope(SCOPE).scope_hash, 3.0)
    assert editor.post(setter, {"scope": SCOPE, "weight": "0.5"}).status_code == 302
    assert ScopeWeight.objects.get().weight == 0.5
    # The row's own page is read-only, as every admin page of the apps.
    change = reverse("admin:jobs_scopeweight_change", args=[row.pk])
    assert editor.post(change, {"weight": "9"}).status_code == 403
    assert ScopeWeight.objects.get().weight == 0.5


def test_scope_shares_list_each_scope_line_with_its_work(admin_client: Client) -> None:
    execution.set_scope_weight(SCOPE, 2)
    submit("share-1")
    running("share-2")
    submit("other-1", scope=OTHER_SCOPE)
    content = admin_client.get(reverse("admin:jobs_lane_changelist")).content.decode()
    assert JobScope(SCOPE).scope_hash in content
    assert JobScope(OTHER_SCOPE).scope_hash in content
    assert "2.0" in content


def test_a_queued_job_page_says_why_it_waits(admin_client: Client) -> None:
    from datetime import timedelta

    from django.utils import timezone

    soon = timezone.now() + timedelta(hours=1)
    waiting = {
        "due": JobSubmission.create("reports.generate", {}),
        "later": JobSubmission.create("reports.generate", {}, not_before=soon),
        "debounced": JobSubmission.create(
            "reports.generate", {}, unique_key="d", debounce=60, debounce_max=600
        ),
        "late": JobSubmission.create("reports.generate", {}, start_by=timezone.now()),
    }
    for job_id, submission in waiting.items():
        submit_job(SCOPE, job_id, submission)
    execution.pause_queue("held")
    submit_job(SCOPE, "held", JobSubmission.create("reports.generate", {}, queue="held"))

    def reason(job_id: str) -> str:
        page = admin_client.get(reverse("admin:jobs_job_change", args=[job(job_id).pk]))
        return page.content.decode()

    assert "due: 0 due job(s) of queue &#x27;default&#x27; go before it" in reason("due")
    assert "delayed: not due until" in reason("later")
    assert "debounced: not due until" in reason("debounced")
    assert "start deadline" in reason("late")
    assert "is paused" in reason("held")


def test_a_job_page_names_the_limit_that_holds_it_with_its_count(admin_client, handler) -> None:
    handler("reports.generate", max_running=1)(lambda ctx: None)
    running("first")
    submit("second")
    page = admin_client.get(reverse("admin:jobs_job_change", args=[job("second").pk]))
    assert (
        "<li>over handler &#x27;reports.generate&#x27; max_running=1: 1 running of 1</li>"
        in page.content.decode()
    )
    # A job that is not Queued does not wait.
    page = admin_client.get(reverse("admin:jobs_job_change", args=[job("first").pk]))
    assert 'class="jobs-waiting"' not in page.content.decode()


def test_the_limit_keys_page_shows_each_key_against_its_cap(
    staff_client: Any, handler: Any, settings: Any
) -> None:
    handler("reports.generate", max_running_per_key=1)(lambda ctx: None)
    settings.JOBS = {"QUEUES": {"emails": {"rate": (10, 1)}}}
    for n in range(2):
        submit_job(SCOPE, f"k{n}", JobSubmission.create("reports.generate", {}, limit_key="acct-a"))
    submit("mail-1", queue="emails", handler="mail.send")
    assert len(execution.claim_due("w", limit=5, queues=["default"])) == 1
    viewer = staff_client("view_queue")
    assert (
        reverse("admin:jobs_queue_keys")
        in viewer.get(reverse("admin:jobs_queue_changelist")).content.decode()
    )
    response = viewer.get(reverse("admin:jobs_queue_keys"))
    assert response.context["rows"] == [
        (True, ("handler:reports.generate", "acct-a", "1", "1", "1", "-", "-", "-")),
        (False, ("queue:emails", "*", "1", "0", "-", "10/1s", "10/10", "now")),
    ]
    assert "<strong>full</strong>" in response.content.decode()
    only = viewer.get(reverse("admin:jobs_queue_keys"), {"queue": "emails"})
    assert [cells[0] for _full, cells in only.context["rows"]] == ["queue:emails"]
    bad = viewer.get(reverse("admin:jobs_queue_keys"), {"queue": "bad queue"})
    assert bad.context["rows"] == []
    (message,) = [str(m) for m in get_messages(bad.wsgi_request)]
    assert "queue" in message
    assert staff_client("view_job").get(reverse("admin:jobs_queue_keys")).status_code == 403
