"""Limits by key: ``max_running_per_key`` counts the Running jobs of one ``limit_key``
across every scope and worker, kept by the claim itself on both databases; jobs of a
key at its limit stay Queued and the claim takes others past them."""

from __future__ import annotations

import pytest

from jobs import JobSubmission, execution, submit_job
from jobs.exceptions import InvalidLimits, InvalidSubmission, JobsConfigurationError
from jobs.flow_control import Limits
from jobs.models import Job
from jobs.types import JobStatus
from tests.jobs.test_jobs_flow import _race_for_the_last_slot

pytestmark = pytest.mark.django_db(transaction=True)


def submit(job_id: str, key: str | None, *, scope: str = "tenant-a", handler: str = "keyed.work"):
    return submit_job(scope, job_id, JobSubmission.create(handler, {}, limit_key=key))


def running_by_key() -> dict[str, int]:
    rows = Job.objects.filter(status=JobStatus.RUNNING).values_list("limit_key", flat=True)
    counts: dict[str, int] = {}
    for key in rows:
        counts[key] = counts.get(key, 0) + 1
    return counts


def test_one_running_per_key_and_jobs_without_a_key_go_free(handler) -> None:
    handler("keyed.work", max_running_per_key=1)(lambda ctx: None)
    for n in range(3):
        submit(f"a{n}", "acct-a")
        submit(f"b{n}", "acct-b", scope="tenant-b")
    submit("free-0", None)
    submit("free-1", None)
    claims = execution.claim_due("w1", limit=10)
    assert len(claims) == 4
    assert running_by_key() == {"acct-a": 1, "acct-b": 1, "": 2}
    assert execution.claim_due("w1", limit=10) == []
    # The end of the key's Running job frees its slot for the next of the key.
    done = next(claim for claim in claims if claim.job_id == "a0")
    execution.complete(done.token)
    (next_claim,) = execution.claim_due("w1", limit=10)
    assert next_claim.job_id == "a1"


def test_a_key_counts_across_scopes(handler) -> None:
    handler("keyed.work", max_running_per_key=2)(lambda ctx: None)
    for scope in ("tenant-a", "tenant-b", "tenant-c"):
        submit(f"{scope}-0", "shared", scope=scope)
    assert len(execution.claim_due("w1", limit=10)) == 2
    assert running_by_key() == {"shared": 2}


def test_no_head_of_line_blocking_behind_a_full_key(handler) -> None:
    handler("keyed.work", max_running_per_key=1)(lambda ctx: None)
    for n in range(20):
        submit(f"a{n}", "acct-a")
    submit("b0", "acct-b")
    claims = execution.claim_due("w1", limit=2)
    assert sorted(claim.job_id for claim in claims) == ["a0", "b0"]


def test_a_queue_limits_its_keys_too(settings) -> None:
    settings.JOBS = {**settings.JOBS, "QUEUES": {"keyed": {"max_running_per_key": 1}}}
    for n in range(3):
        submit_job(
            "tenant-a", f"q{n}", JobSubmission.create("any", {}, queue="keyed", limit_key="k")
        )
    assert len(execution.claim_due("w1", limit=5, queues=["keyed"])) == 1


def test_racing_claimers_never_take_a_key_past_its_limit(handler) -> None:
    handler("flow.one", max_running_per_key=1)(lambda ctx: None)
    for n in range(16):
        submit(f"k{n}", "acct-x", handler="flow.one")
    results = _race_for_the_last_slot("flow.one")
    assert sum(results) == 1, results
    assert running_by_key() == {"acct-x": 1}


def test_a_bad_limit_key_or_limit_is_a_typed_error_that_writes_nothing(handler) -> None:
    for key in ("", "x" * 201, "bad\x00key", 7):
        with pytest.raises(InvalidSubmission):
            submit("bad", key)  # type: ignore[arg-type]
    assert not Job.objects.exists()
    for value in (0, -1, True, 1.5):
        with pytest.raises(InvalidLimits):
            Limits(max_running_per_key=value)  # type: ignore[arg-type]
    with pytest.raises(JobsConfigurationError):
        handler("keyed.bad", max_running_per_key=0)
    assert Limits(max_running_per_key=3).describe() == "max_running_per_key=3"
