"""Rates per key, bursts and costs: ``rate_per_key`` gives every limit key of a handler
or a queue its own rate; a third element makes a rate a token bucket; a job's ``cost``
counts that many units against every rate it falls under. Kept by the claim on both
databases, with the claim's clock given (``now=``), never the wall clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from jobs import JobSubmission, execution, stage_job, submit_job, submit_jobs
from jobs.exceptions import CostOverRate, InvalidLimits, InvalidSubmission
from jobs.flow_control import Limits
from jobs.models import Job, RateBucket
from jobs.types import JobStatus
from tests.jobs.test_jobs_flow import _race_for_the_last_slot

pytestmark = pytest.mark.django_db(transaction=True)

HANDLER = "keyed.rated"


def submit(job_id: str, key: str | None, *, cost: int = 1, handler: str = HANDLER) -> None:
    submit_job("tenant-a", job_id, JobSubmission.create(handler, {}, limit_key=key, cost=cost))


def claimed(now, limit: int = 20) -> list[str]:
    return sorted(claim.job_id for claim in execution.claim_due("w", limit=limit, now=now))


def test_each_key_has_its_own_bucket_and_a_full_one_holds_back_no_other(handler) -> None:
    """(1, 60, 3): three starts of a key at once, then one a minute; the jobs behind a
    full key wait while another key's start, and jobs without a key go free."""
    handler(HANDLER, rate_per_key=(1, 60, 3))(lambda ctx: None)
    for n in range(5):
        submit(f"a{n}", "acct-a")
    submit("b0", "acct-b")
    submit("free", None)
    now = timezone.now()
    assert claimed(now) == ["a0", "a1", "a2", "b0", "free"]
    assert claimed(now + timedelta(seconds=59)) == []
    assert claimed(now + timedelta(seconds=60)) == ["a3"]
    assert claimed(now + timedelta(seconds=61)) == []
    assert claimed(now + timedelta(seconds=120)) == ["a4"]


def test_a_key_quiet_for_its_burst_has_the_whole_burst_again(handler) -> None:
    handler(HANDLER, rate_per_key=(2, 10, 4))(lambda ctx: None)
    for n in range(12):
        submit(f"a{n}", "acct-a")
    now = timezone.now()
    assert len(claimed(now)) == 4
    # Quiet for burst × interval (4 × 5 s): four at once again, not more.
    assert len(claimed(now + timedelta(seconds=20))) == 4
    assert claimed(now + timedelta(seconds=20, milliseconds=1)) == []


@pytest.mark.parametrize("rate", [(10, 60), (1, 60, 10)], ids=["window", "bucket"])
def test_a_cost_counts_its_units_against_the_rate(handler, rate) -> None:
    """Ten units: two jobs of cost 4 start, the third (4 more) waits, and a job of
    cost 2 behind it still fits."""
    handler(HANDLER, rate_per_key=rate)(lambda ctx: None)
    for n in range(3):
        submit(f"c{n}", "acct-a", cost=4)
    submit("small", "acct-a", cost=2)
    assert claimed(timezone.now()) == ["c0", "c1", "small"]
    (row,) = RateBucket.objects.filter(key=f"handler:{HANDLER}#acct-a")
    assert row.used == (10 if rate[1:] == (60,) else None)


def test_a_queue_rate_per_key_counts_each_key_of_the_queue(settings) -> None:
    settings.JOBS = {**settings.JOBS, "QUEUES": {"keyed": {"rate_per_key": (2, 60)}}}
    for n in range(3):
        for key in ("k1", "k2"):
            submit_job(
                "tenant-a",
                f"{key}-{n}",
                JobSubmission.create("any", {}, queue="keyed", limit_key=key),
            )
    assert len(execution.claim_due("w", limit=10, queues=["keyed"])) == 4


def test_a_window_counts_a_start_a_claimer_with_a_later_clock_made_for_another_behind(
    handler,
) -> None:
    """(2, 60) and three claimers whose clocks differ: one at ``now`` starts a job, one
    61 s ahead starts another (its window no longer holds the first), then one 59 s
    ahead — whose window holds both — must start nothing: the row kept the first
    start for claimers whose clocks are behind."""
    handler(HANDLER, rate=(2, 60))(lambda ctx: None)
    for n in range(4):
        submit(f"j{n}", None)
    now = timezone.now()
    assert len(claimed(now, limit=1)) == 1
    assert len(claimed(now + timedelta(seconds=61), limit=1)) == 1
    assert claimed(now + timedelta(seconds=59)) == []
    assert len(claimed(now + timedelta(seconds=121))) == 2


@pytest.mark.parametrize("rate", [(1, 3600), (1, 3600, 1)], ids=["window", "bucket"])
def test_racing_claimers_never_take_a_keys_rate_past_its_last_start(handler, rate) -> None:
    handler("flow.one", rate_per_key=rate)(lambda ctx: None)
    for n in range(16):
        submit(f"k{n}", "acct-x", handler="flow.one")
    results = _race_for_the_last_slot("flow.one")
    assert sum(results) == 1, results
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 1


def test_a_bad_cost_is_a_typed_error_that_writes_nothing(handler) -> None:
    handler(HANDLER, rate=(10, 1, 5), rate_per_key=(3, 1))(lambda ctx: None)
    for cost in (0, -1, 1001, True, 1.5, "2"):
        with pytest.raises(InvalidSubmission):
            submit("bad", "acct-a", cost=cost)  # type: ignore[arg-type]
    # Above a declared rate's capacity: its burst (5), else its count (3, per key).
    with pytest.raises(CostOverRate, match="burst 5"):
        submit("over-burst", None, cost=6)
    with pytest.raises(CostOverRate, match="rate_per_key"):
        submit("over-key", "acct-a", cost=4)
    with pytest.raises(CostOverRate):
        submit_jobs(
            [
                ("tenant-a", "fits", JobSubmission.create(HANDLER, {}, limit_key="k", cost=3)),
                ("tenant-a", "over", JobSubmission.create(HANDLER, {}, limit_key="k", cost=4)),
            ]
        )
    with pytest.raises(CostOverRate), transaction.atomic():
        stage_job("tenant-a", "staged", JobSubmission.create(HANDLER, {}, cost=6))
    assert not Job.objects.exists()
    # Without a limit key the per-key rate does not apply: only the burst bounds it.
    submit("no-key", None, cost=4)
    assert Job.objects.get().cost == 4


def test_bad_rates_are_typed_errors() -> None:
    for rate in ((1, 1, 0), (1, 1, True), (1, 1, 1.5), (1, 0), (0, 1), (1, 1, 1, 1)):
        with pytest.raises(InvalidLimits):
            Limits(rate_per_key=rate)  # type: ignore[arg-type]
    assert Limits(rate_per_key=(10, 1, 20)).describe() == "rate_per_key=10/1s burst 20"
