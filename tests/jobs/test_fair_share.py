"""Fair share across scopes: the place in line each job takes at submit, and the order
in which claims take due jobs — in proportion to each scope's weight, whatever the size
of one scope's backlog; priority first; submission order in a queue that is not fair."""

from __future__ import annotations

import itertools
import math
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from jobs import JobScope, JobSubmission, execution, stage_job, submit_job
from jobs.api import submit_jobs
from jobs.conf import jobs_settings
from jobs.exceptions import InvalidWeight, JobsConfigurationError
from jobs.fair_share import QUANTUM, place
from jobs.models import Job, Lane, ScopeWeight

BIG, SMALL, OTHER = "tenant-big", "tenant-small", "tenant-other"


def sub(handler: str = "fair.work", **kwargs) -> JobSubmission:
    return JobSubmission.create(handler, {"x": 1}, **kwargs)


def backlog(scope: str, count: int, *, prefix: str = "b", **kwargs) -> None:
    results = submit_jobs([(scope, f"{prefix}{n}", sub(**kwargs)) for n in range(count)])
    assert all(result.created for result in results)


def claimed_scopes(count: int) -> list[str]:
    """The scopes of the next ``count`` jobs claimed one at a time, as names."""
    names = {JobScope(name).scope_hash: name for name in (BIG, SMALL, OTHER)}
    order = []
    for _ in range(count):
        (claim,) = execution.claim_due("w1", limit=1)
        order.append(names[claim.scope_hash])
    return order


def positions(order: list[str], scope: str) -> list[int]:
    return [n for n, name in enumerate(order) if name == scope]


@pytest.mark.django_db(transaction=True)
class TestFairOrder:
    def test_a_small_scope_is_not_stuck_behind_a_big_backlog(self) -> None:
        backlog(BIG, 50)
        for n in range(3):
            submit_job(SMALL, f"s{n}", sub())
        order = claimed_scopes(10)
        # The newcomer starts next to the head of the line, one place per round.
        assert positions(order, SMALL) == [2, 4, 6]

    def test_claims_of_several_jobs_take_the_same_order(self) -> None:
        backlog(BIG, 50)
        backlog(SMALL, 3, prefix="s")
        claims = execution.claim_due("w1", limit=8)
        small = JobScope(SMALL).scope_hash
        assert [n for n, claim in enumerate(claims) if claim.scope_hash == small] == [2, 4, 6]

    def test_in_submission_order_when_the_queue_is_not_fair(self, submission_order) -> None:
        backlog(BIG, 20)
        backlog(SMALL, 3, prefix="s")
        assert positions(claimed_scopes(23), SMALL) == [20, 21, 22]
        assert not Lane.objects.exists()

    def test_priority_comes_first(self) -> None:
        backlog(BIG, 20, priority=5)
        backlog(SMALL, 3, prefix="s")
        order = claimed_scopes(23)
        assert positions(order, SMALL) == [20, 21, 22]

    def test_weights_share_the_starts(self) -> None:
        assert execution.set_scope_weight(BIG, 3) == 1.0
        backlog(BIG, 60)
        backlog(SMALL, 60, prefix="s")
        order = claimed_scopes(40)
        # Three starts of the weight-3 scope for each of the other's.
        assert abs(order.count(BIG) - 30) <= 1, order

    def test_spreading_jobs_over_handlers_gains_nothing(self) -> None:
        submit_jobs([(BIG, f"b{n}", sub(f"fair.h{n % 5}")) for n in range(40)])
        backlog(SMALL, 5, prefix="s")
        order = claimed_scopes(12)
        assert positions(order, SMALL) == [2, 4, 6, 8, 10]

    def test_a_scope_gets_no_credit_for_a_quiet_spell(self) -> None:
        # SMALL ran alone long ago; its lane's tail is far behind today's head.
        backlog(SMALL, 2, prefix="old")
        claimed_scopes(2)
        backlog(BIG, 30)
        claimed_scopes(10)
        backlog(SMALL, 6, prefix="s")
        order = claimed_scopes(11)
        # Placed by today's head, as a newcomer is: no run of its own first.
        assert positions(order, SMALL) == [2, 4, 6, 8, 10]

    def test_a_repeated_submission_takes_no_place(self) -> None:
        submit_job(SMALL, "s0", sub())
        tail = Lane.objects.get().tail
        again = submit_job(SMALL, "s0", sub())
        assert not again.created
        assert Lane.objects.get().tail == tail

    def test_a_staged_job_takes_its_place_in_the_callers_transaction(self) -> None:
        backlog(BIG, 20)
        with transaction.atomic():
            stage_job(SMALL, "s0", sub())
        assert positions(claimed_scopes(4), SMALL) == [2]

    def test_a_rolled_back_stage_leaves_no_job(self) -> None:
        backlog(BIG, 3)

        def business() -> None:
            with transaction.atomic():
                stage_job(SMALL, "s0", sub())
                raise RuntimeError("business failure")

        with pytest.raises(RuntimeError):
            business()
        assert not Job.objects.filter(job_id="s0").exists()
        assert not Lane.objects.filter(scope_hash=JobScope(SMALL).scope_hash).exists()

    def test_a_job_due_later_is_placed_at_its_due_time(self) -> None:
        later = timezone.now() + timedelta(hours=1)
        job = submit_job(SMALL, "later", sub(not_before=later))
        assert Job.objects.get(job_id=job.job_id).fair_at == place(later)
        assert not Lane.objects.exists()

    def test_racing_submits_of_one_scope_take_distinct_places(self, concurrently) -> None:
        outcomes = concurrently(*(lambda n=n: submit_job(SMALL, f"r{n}", sub()) for n in range(6)))
        assert all(outcome.error is None for outcome in outcomes), outcomes
        places = sorted(Job.objects.values_list("fair_at", flat=True))
        # Distinct, at least a step apart (the lane's lock orders them; with the queue
        # empty, a submitter that did not see the others' jobs yet anchors at its now).
        assert all(b - a >= QUANTUM for a, b in itertools.pairwise(places)), places


@pytest.mark.django_db(transaction=True)
class TestScopeWeight:
    @pytest.mark.parametrize("weight", [0, -1, 100.5, math.nan, math.inf, True, "2", None])
    def test_a_weight_out_of_range_is_refused_and_writes_nothing(self, weight) -> None:
        with pytest.raises(InvalidWeight):
            execution.set_scope_weight(BIG, weight)
        assert not ScopeWeight.objects.exists()

    def test_the_weight_is_persisted_and_replaced(self) -> None:
        assert execution.set_scope_weight(BIG, 100) == 1.0
        assert execution.set_scope_weight(BIG, 0.5) == 100.0
        assert ScopeWeight.objects.get().weight == 0.5
        reserved = execution.reserved_scope("periodic")
        execution.set_scope_weight(reserved, 2)
        assert ScopeWeight.objects.filter(scope_hash=reserved.scope_hash).get().weight == 2

    def test_shares_show_each_scope_with_work(self) -> None:
        execution.set_scope_weight(BIG, 4)
        backlog(BIG, 5)
        backlog(SMALL, 2, prefix="s")
        execution.claim_due("w1", limit=1)
        shares = {share.scope_hash: share for share in execution.scope_shares()}
        big = shares[JobScope(BIG).scope_hash]
        assert (big.queue, big.weight, big.queued, big.running) == ("default", 4.0, 4, 1)
        assert shares[JobScope(SMALL).scope_hash].weight == 1.0


class TestFairSetting:
    def test_fair_must_be_a_bool(self, settings) -> None:
        settings.JOBS = {**settings.JOBS, "QUEUES": {"default": {"fair": "yes"}}}
        with pytest.raises(JobsConfigurationError, match="fair"):
            jobs_settings()

    def test_fair_sits_beside_limits(self, settings) -> None:
        settings.JOBS = {**settings.JOBS, "QUEUES": {"emails": {"fair": False, "max_running": 2}}}
        assert execution.claim_limits().queues["emails"].max_running == 2
