"""docs/flow-control.md stays true: its Python examples run as they are written, in
order, and do what the page says."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobs import JobScope, JobStatus
from jobs.conf import jobs_settings
from jobs.handlers import unregister
from jobs.models import JobAttempt, ScopeWeight
from jobs.store.waiting import OverLimit
from tests.test_docs_examples import python_blocks, run_page

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "docs/flow-control.md"


@pytest.fixture
def page_handlers():
    """The page registers a handler with a limit: gone after the test, so that no later
    test claims under it."""
    yield
    unregister("crm.push", 1)
    unregister("mail.send", 1)
    unregister("sms.send", 1)


def test_the_flow_control_page_examples_do_what_the_page_says(page_handlers):
    assert len(python_blocks(PAGE)) == 9
    namespace = run_page(PAGE)

    # Fair share: the small tenant's jobs start next to the head of the line.
    assert namespace["started_small"] == [2, 4]
    weight = ScopeWeight.objects.get(scope_hash=JobScope("tenant-big").scope_hash)
    assert weight.weight == 4
    # The settings block is a valid JOBS setting, and the queue it names is not fair.
    settings = jobs_settings.read(namespace["JOBS"])
    assert settings.QUEUES["ledger"]["fair"] is False

    # Limits by key: one push per account; the other account's went past.
    assert namespace["pushed"] == ["push-a0", "push-b0"]
    # Rates per key: a burst of five and a digest of cost five, then two refilled.
    mails = sorted(claim.job_id for claim in namespace["mails_now"])
    assert mails == ["digest-b", "mail-a0", "mail-a1", "mail-a2", "mail-a3", "mail-a4"]
    assert sorted(claim.job_id for claim in namespace["mails_later"]) == ["mail-a5", "mail-a6"]

    # Unique jobs: the second submission returned the first job.
    assert namespace["first"].created
    assert (namespace["again"].job_id, namespace["again"].created) == ("sync-1", False)
    # Debounce: one job, the latest payload, due 5 s after the last submission.
    burst = namespace["burst"]
    assert (burst.job_id, burst.created, burst.payload) == ("reindex-1", False, {"version": 3})
    first_edit = namespace["first_edit"]
    assert first_edit.next_run_at == first_edit.created_at + timedelta(seconds=5)
    assert burst.next_run_at > first_edit.next_run_at

    # Start deadlines: both late jobs expired, with no attempt.
    assert namespace["expired"] == 2
    assert namespace["code"].status == JobStatus.EXPIRED
    assert not JobAttempt.objects.filter(job__job_id__in=["remind-42", "otp-7"]).exists()

    # Why is my job waiting: the second message is held by its key's limit.
    assert namespace["waiting"].reasons == (
        OverLimit(
            on="handler", name="sms.send", rule="max_running_per_key", cap=1, running=1,
            limit_key="gateway-1",
        ),
    )  # fmt: skip
    assert namespace["waiting"].describe() == (
        "over handler 'sms.send' max_running_per_key=1 for key 'gateway-1': 1 running of 1"
    )
