"""docs/flow-control.md stays true: its Python examples run as they are written, in
order, and do what the page says."""

from __future__ import annotations

import pytest

from jobs import JobScope, JobStatus
from jobs.conf import jobs_settings
from jobs.models import JobAttempt, ScopeWeight
from tests.test_docs_examples import python_blocks, run_page

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "docs/flow-control.md"


def test_the_flow_control_page_examples_do_what_the_page_says():
    assert len(python_blocks(PAGE)) == 4
    namespace = run_page(PAGE)

    # Fair share: the small tenant's jobs start next to the head of the line.
    assert namespace["started_small"] == [2, 4]
    weight = ScopeWeight.objects.get(scope_hash=JobScope("tenant-big").scope_hash)
    assert weight.weight == 4
    # The settings block is a valid JOBS setting, and the queue it names is not fair.
    settings = jobs_settings.read(namespace["JOBS"])
    assert settings.QUEUES["ledger"]["fair"] is False

    # Start deadlines: both late jobs expired, with no attempt.
    assert namespace["expired"] == 2
    assert namespace["code"].status == JobStatus.EXPIRED
    assert not JobAttempt.objects.filter(job__job_id__in=["remind-42", "otp-7"]).exists()
