"""Why a job waits (``execution.why_waiting``) and each limit key's state
(``execution.key_states``): every reason comes from a real state — made by the
transitions a worker makes, under the limits the test declares — on both databases,
with the claims' clock given (``now=``), never the wall clock."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs import JobScope, JobSubmission, execution, submit_job
from jobs.exceptions import InvalidScope, JobNotFound
from jobs.flow_control import Rate
from jobs.models import Job
from jobs.store.waiting import (
    BehindSequence,
    DueCause,
    Expired,
    InLine,
    KeyState,
    NoAttemptsLeft,
    NotDue,
    OverLimit,
    OverRate,
    QueuePaused,
)
from jobs.types import JobStatus

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-why"
HASH = JobScope(SCOPE).scope_hash


def submit(job_id: str, handler: str = "why.work", *, scope: str = SCOPE, **options) -> None:
    submit_job(scope, job_id, JobSubmission.create(handler, {}, **options))


def why(job_id: str, *, scope: str = SCOPE, now=None):
    return execution.why_waiting(JobScope(scope).scope_hash, job_id, now=now).reasons


def start(job_id: str, *, now=None):
    claim = execution.try_start(HASH, job_id, "w", now=now)
    assert claim is not None
    return claim


def test_a_due_job_free_of_limits_waits_for_its_place_in_line() -> None:
    for n in range(3):
        submit(f"j{n}")
    submit("urgent", priority=5)
    assert why("j0") == (InLine(queue="default", ahead=1),)
    assert why("j2") == (InLine(queue="default", ahead=3),)
    assert (
        "3 due job(s) of queue 'default' go before it"
        in execution.why_waiting(HASH, "j2").describe()
    )


def test_a_job_not_queued_has_no_reason() -> None:
    submit("j")
    start("j")
    waiting = execution.why_waiting(HASH, "j")
    assert (waiting.status, waiting.reasons, waiting.describe()) == (JobStatus.RUNNING, (), "-")


def test_a_passed_start_deadline_is_the_only_reason() -> None:
    execution.pause_queue("held")
    submit("late", queue="held", start_within=60)
    now = timezone.now()
    start_by = Job.objects.get(job_id="late").start_by
    (reason,) = why("late", now=now + timedelta(minutes=2))
    assert reason == Expired(start_by=start_by)
    assert "passed: it never starts" in reason.describe()


def test_a_paused_queue() -> None:
    execution.pause_queue("held")
    submit("j", queue="held")
    assert why("j") == (QueuePaused(queue="held"),)
    assert why("j")[0].describe() == "its queue 'held' is paused"


def test_not_due_says_why_from_the_job_data(settings) -> None:
    now = timezone.now()
    later = now + timedelta(hours=1)
    execution.pause_queue("held")
    submit("delayed", queue="held", not_before=later)
    assert why("delayed") == (
        QueuePaused(queue="held"),
        NotDue(until=later, cause=DueCause.DELAY),
    )

    submit("debounced", unique_key="k", debounce=60, debounce_max=600)
    row = Job.objects.get(job_id="debounced")
    (reason,) = why("debounced")
    assert reason == NotDue(
        until=row.next_run_at, cause=DueCause.DEBOUNCE, latest=row.debounce_until
    )
    assert reason.describe().startswith("debounced: not due until")
    assert "at the latest" in reason.describe()

    submit("failed", max_attempts=3)
    execution.fail(start("failed").token, "boom", retry_at=later)
    assert why("failed") == (NotDue(until=later, cause=DueCause.BACKOFF),)

    submit("snoozed")
    execution.snooze(start("snoozed").token, later)
    assert why("snoozed") == (NotDue(until=later, cause=DueCause.SNOOZE),)

    submit("unknown")
    execution.put_back_unknown_handler(start("unknown").token, "no such handler")
    (reason,) = why("unknown")
    put_back_until = Job.objects.get(job_id="unknown").next_run_at
    assert reason == NotDue(until=put_back_until, cause=DueCause.UNKNOWN_HANDLER)
    assert "does not know its handler" in reason.describe()


def test_a_job_due_again_after_its_back_off_is_in_line() -> None:
    submit("failed", max_attempts=3)
    now = timezone.now()
    execution.fail(start("failed", now=now).token, "boom", retry_at=now, now=now)
    assert why("failed", now=now) == (InLine(queue="default", ahead=0),)


def test_no_attempt_left_in_a_row_written_straight_into_the_table() -> None:
    submit("j", max_attempts=1)
    Job.objects.filter(job_id="j").update(attempt_count=1)
    assert why("j") == (NoAttemptsLeft(attempts=1, max_attempts=1),)


def test_each_counted_limit_at_its_cap_with_its_count(handler, settings) -> None:
    handler("why.work", max_running=3, max_running_per_scope=1)(lambda ctx: None)
    settings.JOBS = {**settings.JOBS, "QUEUES": {"crm": {"max_running_per_key": 1}}}
    submit("a0", queue="crm", limit_key="acct-a")
    submit("a1", queue="crm", limit_key="acct-a")
    submit("b0", queue="crm", limit_key="acct-b", scope="tenant-other")
    assert len(execution.claim_due("w", limit=10, queues=["crm"])) == 2
    reasons = why("a1")
    assert reasons == (
        OverLimit(
            on="handler", name="why.work", rule="max_running_per_scope", cap=1, running=1,
            scope_hash=HASH,
        ),
        OverLimit(
            on="queue", name="crm", rule="max_running_per_key", cap=1, running=1,
            limit_key="acct-a",
        ),
    )  # fmt: skip
    assert reasons[1].describe() == (
        "over queue 'crm' max_running_per_key=1 for key 'acct-a': 1 running of 1"
    )
    # A third job of another scope and key meets the handler's own cap.
    submit("c0", queue="crm", limit_key="acct-c", scope="tenant-third")
    assert len(execution.claim_due("w", limit=10, queues=["crm"])) == 1
    submit("d0", queue="crm", limit_key="acct-d", scope="tenant-fourth")
    assert why("d0", scope="tenant-fourth") == (
        OverLimit(on="handler", name="why.work", rule="max_running", cap=3, running=3),
    )


def test_a_rate_per_key_says_when_its_next_unit_is_free(handler) -> None:
    handler("why.work", rate_per_key=(1, 60, 1))(lambda ctx: None)
    submit("a0", limit_key="acct-a")
    submit("a1", limit_key="acct-a")
    submit("b0", limit_key="acct-b")
    now = timezone.now()
    assert sorted(c.job_id for c in execution.claim_due("w", limit=10, now=now)) == ["a0", "b0"]
    (reason,) = why("a1", now=now)
    assert reason == OverRate(
        on="handler", name="why.work", rule="rate_per_key", rate=Rate(1, 60.0, 1), units=1,
        room=0, frees_at=now + timedelta(seconds=60), limit_key="acct-a",
    )  # fmt: skip
    assert "over handler 'why.work' rate_per_key=1/60s burst 1 for key 'acct-a'" in (
        reason.describe()
    )
    # Once the unit is free the job is due and free of limits.
    assert why("a1", now=now + timedelta(seconds=60)) == (InLine(queue="default", ahead=0),)


def test_a_queue_window_rate_and_a_cost(settings) -> None:
    settings.JOBS = {**settings.JOBS, "QUEUES": {"mail": {"rate": (3, 10)}}}
    submit("m0", queue="mail", cost=2)
    submit("m1", queue="mail", cost=2)
    now = timezone.now()
    assert [c.job_id for c in execution.claim_due("w", limit=10, now=now)] == ["m0"]
    (reason,) = why("m1", now=now + timedelta(seconds=1))
    assert reason == OverRate(
        on="queue", name="mail", rule="rate", rate=Rate(3, 10.0), units=2, room=1,
        frees_at=now + timedelta(seconds=10),
    )  # fmt: skip
    assert reason.describe().endswith(
        f"needs 2 unit(s), 1 free; free at {now + timedelta(seconds=10):%Y-%m-%d %H:%M:%S} UTC"
    )


def test_bad_input_is_refused() -> None:
    with pytest.raises(InvalidScope):
        execution.why_waiting("not-a-hash", "j")
    with pytest.raises(JobNotFound):
        execution.why_waiting(HASH, "missing")


def test_key_states_show_each_limit_and_key_with_work(handler, settings) -> None:
    handler("why.work", max_running=5, max_running_per_key=1, rate_per_key=(1, 60, 2))(
        lambda ctx: None
    )
    settings.JOBS = {
        **settings.JOBS,
        "QUEUES": {"mail": {"rate": (10, 1)}, "idle": {"rate": (1, 1)}},
    }
    for n in range(3):
        submit(f"a{n}", queue="mail", limit_key="acct-a")
    submit("free", queue="mail")
    submit("other", "other.work", queue="default")
    now = timezone.now()
    assert len(execution.claim_due("w", limit=10, queues=["mail"], now=now)) == 2
    later = now + timedelta(seconds=1)
    states = execution.key_states(now=later)
    assert states == [
        KeyState(
            on="handler", name="why.work", limit_key="", queued=2, running=2, cap=5, rate=None,
            room=None, frees_at=None,
        ),
        KeyState(
            on="handler", name="why.work", limit_key="acct-a", queued=2, running=1, cap=1,
            rate=Rate(1, 60.0, 2), room=1, frees_at=None,
        ),
        KeyState(
            on="queue", name="mail", limit_key="", queued=2, running=2, cap=None,
            rate=Rate(10, 1.0), room=10, frees_at=None,
        ),
    ]  # fmt: skip
    assert [state.full for state in states] == [False, True, False]
    assert execution.key_states("default", now=later) == []


def test_a_held_job_waits_for_the_earlier_job_of_its_sequence_or_its_halt(handler) -> None:
    handler("why.post", sequence_halts_on_failure=True)(lambda ctx: None)
    for n in range(3):
        submit(f"p{n}", "why.post", sequence_key="acct-1")
    assert why("p2") == (BehindSequence(sequence_key="acct-1", earlier="p0"),)
    (claim,) = execution.claim_due("w", limit=5)
    assert why("p1") == (BehindSequence(sequence_key="acct-1", earlier="p0"),)
    assert why("p1")[0].describe() == (
        "held: it waits for an earlier job of its sequence 'acct-1': 'p0' goes first"
    )
    execution.fail(claim.token, "the ledger is closed")
    (reason,) = why("p1")
    assert reason == BehindSequence(sequence_key="acct-1", halted_by="p0")
    assert reason.describe().endswith(
        "the sequence is halted by failed job 'p0'; retry or cancel that job to go on"
    )
