"""Flow control and snoozing, in process: limits kept by the claim itself under
concurrent claims on real connections, no head-of-line blocking, paused queues, and
the attempt counts of a snoozed job."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import JobScope, JobStatus, JobSubmission, Snooze, execution, submit_job
from jobs.exceptions import InvalidInput, InvalidLimits, InvalidSubmission
from jobs.flow_control import Limits, Rate
from jobs.handlers import RetryPolicy
from jobs.models import Job, JobAttempt, Queue, RateBucket
from jobs.store import claiming, sql, sql_limits
from jobs.store import limits as limits_store
from jobs.testing import run_jobs_inline
from jobs.types import AttemptStatus, FinishOutcome
from jobs.worker import Worker
from tests.conftest import in_own_connection
from tests.support.procs import wait_until

SCOPE = "flow-tests"


def submit(n: int, handler: str, *, prefix: str = "j", scope: str = SCOPE, **kwargs) -> None:
    for i in range(n):
        submit_job(scope, f"{prefix}{i}", JobSubmission.create(handler, {"n": i}, **kwargs))


def running(handler: str) -> int:
    return Job.objects.filter(handler=handler, status=JobStatus.RUNNING).count()


# --------------------------------------------------------------------------- the last slot


def _race_for_the_last_slot(handler_name: str, *, others_wait: bool = True) -> list[int]:
    """Three claimers on their own connections. The first claims inside a transaction
    of its own and holds it open, its claim not yet committed, while the two others
    claim (each a claim's own transaction: on PostgreSQL the locks, the claim and the
    commit in one round trip); then it commits — once both others wait for a lock it
    holds, or, without ``others_wait``, once both have claimed. Returns how many jobs
    each claimed."""
    first = threading.Event()
    go = threading.Event()
    others_done = threading.Barrier(3)

    def claimer(is_first: bool) -> int:
        if is_first:
            with transaction.atomic():
                claimed = len(execution.claim_due("w", limit=5))
                first.set()
                assert go.wait(60)
            return claimed
        assert first.wait(60)
        try:
            return len(execution.claim_due("w", limit=5))
        finally:
            others_done.wait(60)

    results: list[int] = [0, 0, 0]
    threads = [
        threading.Thread(
            target=in_own_connection(lambda n=n: results.__setitem__(n, claimer(is_first=n == 0)))
        )
        for n in range(3)
    ]
    for thread in threads:
        thread.start()
    assert first.wait(60)
    if connection.vendor == "postgresql" and others_wait:
        # Both others wait for a lock the first one holds — the claim's advisory lock,
        # or the row of a limit counter it changed —, not one moment less.
        wait_until(_waiting_for_locks(2), 30, "two claims waiting for a lock")
        go.set()
        others_done.wait(60)
    elif connection.vendor == "postgresql":
        # Nothing to wait for: let the others finish before the first commits.
        others_done.wait(60)
        go.set()
    else:
        # SQLite: the others wait for the first one's write lock.
        go.set()
        others_done.wait(60)
    for thread in threads:
        thread.join(60)
    return results


def _waiting_for_locks(count: int):
    def check() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted")
            return cursor.fetchone()[0] >= count

    return check


#: The last slot, as a limit of each kind: ``max_running`` (on PostgreSQL a counter with
#: its cap) and ``rate`` (a window's row, or with a burst a token bucket's).
LAST_SLOT = {
    "max_running": {"max_running": 1},
    "rate": {"rate": (1, 3600)},
    "rate_burst": {"rate": (1, 3600, 1)},
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("limit", sorted(LAST_SLOT))
def test_concurrent_claims_never_take_the_last_slot_twice(handler, limit):
    """One slot left and three claimers at once: exactly one job Running, whichever
    order the claims' statements run in."""
    handler("flow.one", **LAST_SLOT[limit])(lambda ctx: None)
    submit(16, "flow.one")
    results = _race_for_the_last_slot("flow.one")
    assert sum(results) == 1, results
    assert running("flow.one") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres_only
@pytest.mark.parametrize("rate", [(1, 3600), (1, 3600, 1)], ids=["window", "bucket"])
def test_without_the_advisory_lock_a_rates_row_still_keeps_its_last_start(
    handler, monkeypatch, rate
):
    """A rate's last start with the lock taken out: the others' claims wait on the
    rate's row the first one changed, and once it commits each goes past the row's
    rate, changes nothing and is made again, finding no room."""
    handler("flow.one", rate=rate)(lambda ctx: None)
    # Enough due jobs that each claim's candidates (up to 5, locked) leave others'.
    submit(16, "flow.one")
    monkeypatch.setattr(limits_store, "lock_ids", lambda names: [])
    results = _race_for_the_last_slot("flow.one")
    assert sum(results) == 1, results
    assert running("flow.one") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres_only
def test_without_the_advisory_lock_a_counters_cap_still_keeps_max_running(handler, monkeypatch):
    """max_running's last slot with the lock taken out: the others' claims wait on the
    limit counter the first one changed, and once it commits each goes past the
    counter's cap, changes nothing and is made again, finding no room."""
    handler("flow.one", max_running=1)(lambda ctx: None)
    submit(16, "flow.one")
    monkeypatch.setattr(limits_store, "lock_ids", lambda names: [])
    results = _race_for_the_last_slot("flow.one")
    assert sum(results) == 1, results
    assert running("flow.one") == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif("connection.vendor == 'postgresql'")
def test_sqlite_immediate_transactions_serialise_claims_without_a_lock(handler, monkeypatch):
    """SQLite: no advisory lock exists, and none is needed — the first claim holds the
    database's write lock from BEGIN IMMEDIATE to its commit."""
    handler("flow.one", max_running=1)(lambda ctx: None)
    # Enough due jobs that each claim's candidates (up to 5, locked) leave others'.
    submit(16, "flow.one")
    monkeypatch.setattr(limits_store, "lock_ids", lambda names: [])
    results = _race_for_the_last_slot("flow.one")
    assert sum(results) == 1, results


# --------------------------------------------------------------------------- claims under limits


@pytest.mark.django_db(transaction=True)
def test_jobs_over_a_limit_stay_queued_and_others_are_claimed_past_them(handler):
    handler("flow.capped", max_running=2)(lambda ctx: None)
    handler("flow.free")(lambda ctx: None)
    submit(6, "flow.capped", prefix="capped-", priority=5)  # first in claim order
    submit(3, "flow.free", prefix="free-")
    claims = execution.claim_due("w", limit=10)
    assert Counter(c.handler for c in claims) == {"flow.capped": 2, "flow.free": 3}
    assert Job.objects.filter(handler="flow.capped", status=JobStatus.QUEUED).count() == 4
    # A full page of capped jobs ahead does not hide the free ones either.
    for claim in claims:
        assert execution.complete(claim.token)
    submit(3, "flow.free", prefix="later-")
    claims = execution.claim_due("w", limit=3)
    assert Counter(c.handler for c in claims) == {"flow.capped": 2, "flow.free": 1}


@pytest.mark.django_db(transaction=True)
def test_queue_limits_from_settings(handler, settings):
    settings.JOBS = {"QUEUES": {"emails": {"max_running": 1, "max_running_per_scope": 1}}}
    handler("flow.mail")(lambda ctx: None)
    submit(3, "flow.mail", prefix="mail-", queue="emails")
    submit(2, "flow.mail", prefix="other-", queue="default")
    claims = execution.claim_due("w", limit=10)
    assert Counter(c.queue for c in claims) == {"emails": 1, "default": 2}


@pytest.mark.django_db(transaction=True)
def test_max_running_per_scope_keeps_one_per_scope_and_every_scope_moves(handler, settings):
    """Five scopes, max_running_per_scope=1, a worker of 5 threads: at most one
    Running job per scope at any moment — seen by the handlers and by a sampler on
    its own connection — and the scopes run side by side."""
    settings.JOBS = {"POLL_INTERVAL": 0.02, "CANCEL_POLL_INTERVAL": 60}
    lock = threading.Lock()
    active: Counter[str] = Counter()
    most_per_scope: Counter[str] = Counter()
    most_scopes = 0

    @handler("flow.tenant", max_running_per_scope=1)
    def run(ctx):
        nonlocal most_scopes
        with lock:
            active[ctx.scope_hash] += 1
            most_per_scope[ctx.scope_hash] = max(
                most_per_scope[ctx.scope_hash], active[ctx.scope_hash]
            )
            most_scopes = max(most_scopes, sum(1 for v in active.values() if v))
        ctx.wait_for_cancel(0.01)
        with lock:
            active[ctx.scope_hash] -= 1

    for tenant in range(5):
        submit(5, "flow.tenant", scope=f"tenant-{tenant}")
    worker = Worker(concurrency=5, listen=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    sampled: Counter[str] = Counter()

    def done() -> bool:
        rows = Job.objects.filter(status=JobStatus.RUNNING).values_list("scope_hash", flat=True)
        for scope_hash, count in Counter(rows).items():
            sampled[scope_hash] = max(sampled[scope_hash], count)
        return not Job.objects.exclude(status=JobStatus.SUCCEEDED).exists()

    try:
        wait_until(done, 60, "every job to succeed")
    finally:
        worker.stop()
        thread.join(30)
    assert set(most_per_scope.values()) == {1}
    assert max(sampled.values(), default=0) <= 1
    assert most_scopes >= 2  # the limit is per scope: scopes ran side by side


@pytest.mark.django_db(transaction=True)
def test_rate_keeps_at_most_count_starts_in_any_window(handler, settings):
    """rate=(20, 1): the attempts' start times, as stored, never put 21 starts inside
    one second — measured over every window, however the claims fell."""
    settings.JOBS = {"POLL_INTERVAL": 0.02, "CANCEL_POLL_INTERVAL": 60}
    handler("flow.rated", rate=(20, 1))(lambda ctx: None)
    submit(50, "flow.rated")
    worker = Worker(concurrency=8, listen=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(
            lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 50,
            60,
            "50 jobs to succeed",
        )
    finally:
        worker.stop()
        thread.join(30)
    starts = sorted(JobAttempt.objects.values_list("started_at", flat=True))
    assert len(starts) == 50
    for first, twenty_first in zip(starts, starts[20:], strict=False):
        assert twenty_first - first >= timedelta(seconds=1), (first, twenty_first)
    (row,) = RateBucket.objects.filter(key="handler:flow.rated")
    assert row.used <= 20


@pytest.mark.django_db(transaction=True)
def test_a_rate_window_counts_starts_a_claimer_with_a_later_clock_made(handler):
    """Claimers' clocks differ: a start recorded 'in the future' of another claimer
    still counts against that claimer's window."""
    handler("flow.rated", rate=(1, 60))(lambda ctx: None)
    submit(3, "flow.rated")
    now = timezone.now()
    assert len(execution.claim_due("fast", limit=5, now=now + timedelta(seconds=5))) == 1
    assert execution.claim_due("slow", limit=5, now=now) == []
    assert len(execution.claim_due("later", limit=5, now=now + timedelta(seconds=66))) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("rate", [(5, 10), (5, 10, 5)], ids=["window", "bucket"])
def test_a_rates_row_is_pruned_only_well_after_it_holds_nothing(handler, rate):
    handler("flow.rated", rate=rate)(lambda ctx: None)
    submit(2, "flow.rated")
    now = timezone.now()
    assert len(execution.claim_due("w", limit=5, now=now)) == 2
    assert execution.prune_rates(now=now + timedelta(seconds=30)) == 0
    assert execution.prune_rates(now=now + timedelta(minutes=6)) == 1
    assert not RateBucket.objects.exists()


def test_bad_limits_are_typed_errors_at_registration(handler):
    for kwargs in (
        {"max_running": 0},
        {"max_running_per_scope": "2"},
        {"rate": (0, 1)},
        {"rate": (5, 0)},
        {"rate": 5},
        {"max_running": True},
    ):
        with pytest.raises(InvalidLimits):
            handler("flow.bad", **kwargs)
    assert Limits(rate=[3, 2]).rate == Rate(3, 2.0)


def test_two_versions_of_a_name_must_declare_the_same_limits(handler):
    handler("flow.versions", max_running=2)(lambda ctx: None)
    with pytest.raises(Exception, match="limits apply to every version"):
        handler("flow.versions", version=2, max_running=3)(lambda ctx: None)
    handler("flow.versions", version=3, max_running=2)(lambda ctx: None)


def test_bad_queue_limits_in_settings_are_configuration_errors(settings):
    from jobs.conf import jobs_settings
    from jobs.exceptions import JobsConfigurationError

    for queues in (
        {"emails": {"max_runing": 4}},
        {"emails": {"rate": (10, -1)}},
        {"bad queue": {"max_running": 1}},
        ["emails"],
    ):
        settings.JOBS = {"QUEUES": queues}
        with pytest.raises(JobsConfigurationError):
            jobs_settings()


def _statements(monkeypatch) -> list[str]:
    """The store's statements the claims run from now on, as texts."""
    seen: list[str] = []
    real = claiming.fetch

    def recording(connection, statement, params, **kwargs):
        seen.append(statement)
        return real(connection, statement, params, **kwargs)

    real_results = limits_store.fetch_results

    def recording_results(connection, statements, params, **kwargs):
        seen.extend(statements)
        return real_results(connection, statements, params, **kwargs)

    monkeypatch.setattr(claiming, "fetch", recording)
    monkeypatch.setattr(limits_store, "fetch", recording)
    monkeypatch.setattr(limits_store, "fetch_results", recording_results)
    return seen


@pytest.mark.django_db(transaction=True)
def test_without_limits_the_claim_is_one_statement(handler, django_assert_num_queries, monkeypatch):
    """No limit configured: the plain claim of :func:`jobs.store.sql.claim`, one
    statement (PostgreSQL; SQLite adds its attempt rows' insert), never the locking
    path. With ``max_running`` or a rate on PostgreSQL, while none binds: the counted
    claim, one statement too, no lock. Once one binds, the claim locks, reads and picks
    — on PostgreSQL in two round trips: the locks, then (timed once it holds them) the
    claim and the commit in one pipeline; on SQLite a limited claim always reads the
    usage under its write lock."""
    handler("flow.free")(lambda ctx: None)
    submit(3, "flow.free")
    statements = _statements(monkeypatch)
    postgres = connection.vendor == "postgresql"
    with django_assert_num_queries(1 if postgres else 4):
        claims = execution.claim_due("w", limit=3)
    assert len(claims) == 3
    plain = sql.claim(connection.vendor, queues=0, one_job=False)
    assert statements == ([plain] if postgres else [plain, sql.insert_attempts(3)])
    assert not any("pg_advisory" in text or "jobs_ratebucket" in text for text in statements)

    handler("flow.capped", max_running=5)(lambda ctx: None)
    handler("flow.rated", rate=(10, 60), rate_per_key=(2, 60, 2))(lambda ctx: None)
    submit(3, "flow.rated", prefix="r", limit_key="acct")
    keys = (
        sql_limits.KeyShape("h", max_running=True),
        sql_limits.KeyShape("h", rate="window", rate_per_key="bucket"),
    )
    counted = sql_limits.counted_claim(queues=0, one_job=False, finishing=False, keys=keys)
    for _ in range(2):
        statements.clear()
        if postgres:
            with django_assert_num_queries(1):
                assert len(execution.claim_due("w", limit=1)) == 1
            assert statements == [counted]
        else:
            assert len(execution.claim_due("w", limit=1)) == 1
            assert statements[0] != plain

    # The key's two starts are taken: its third job binds.
    statements.clear()
    with CaptureQueriesContext(connection) as queries:
        assert execution.claim_due("w", limit=1) == []
    assert any("pg_advisory_xact_lock" in text for text in statements) == postgres
    if postgres:
        limited = sql_limits.limited_claim(queues=0, one_job=False, finishing=False, keys=keys)
        # The counted claim failed; then the exact one, under the handler's lock.
        assert statements == [counted, sql_limits.LOCK_KEYS, limited, sql_limits.COMMIT]
        # Django logs its BEGIN and COMMIT, which psycopg sends lazily: the BEGIN goes
        # with the locks, and the COMMIT finds the transaction ended already.
        begin, locks, pipelined, commit = [q["sql"] for q in queries][-4:]
        assert (begin, pipelined, commit) == ("BEGIN", "; ".join(statements[2:]), "COMMIT")
        assert locks.startswith("SELECT count(pg_advisory_xact_lock(k))")
        # The claim bound: the next goes the exact way at once.
        statements.clear()
        assert execution.claim_due("w", limit=1) == []
        assert statements == [sql_limits.LOCK_KEYS, limited, sql_limits.COMMIT]


# --------------------------------------------------------------------------- pause


@pytest.mark.django_db(transaction=True)
def test_a_paused_queue_is_skipped_by_every_claim_until_resumed(handler):
    handler("flow.mail")(lambda ctx: None)
    submit(2, "flow.mail", prefix="mail-", queue="emails")
    submit(2, "flow.mail", prefix="other-")
    assert execution.pause_queue("emails") is True
    assert execution.pause_queue("emails") is False  # already paused
    claims = execution.claim_due("w", limit=10)
    assert {c.queue for c in claims} == {"default"}
    assert execution.try_start(JobScope(SCOPE).scope_hash, "mail-0", "w") is None
    state = {q.name: q for q in execution.queue_states()}["emails"]
    assert (state.queued, state.running, state.paused) == (2, 0, True)
    assert execution.resume_queue("emails") is True
    assert execution.resume_queue("emails") is False
    assert {c.queue for c in execution.claim_due("w", limit=10)} == {"emails"}
    assert Queue.objects.get(name="emails").paused is False


@pytest.mark.django_db(transaction=True)
def test_pausing_a_bad_queue_name_is_a_typed_error_and_changes_nothing():
    with pytest.raises(InvalidSubmission):
        execution.pause_queue("no spaces")
    with pytest.raises(InvalidSubmission):
        execution.resume_queue("")
    assert not Queue.objects.exists()


# --------------------------------------------------------------------------- snooze


@pytest.mark.django_db(transaction=True)
def test_snooze_requeues_for_later_without_counting_an_attempt(handler):
    seen: list[tuple[int, int]] = []

    @handler("flow.snoozy")
    def run(ctx):
        seen.append((ctx.attempt, ctx.max_attempts))
        if len(seen) <= 2:
            raise Snooze(60)
        return "done"

    submit_job(SCOPE, "s", JobSubmission.create("flow.snoozy", max_attempts=1))
    now = timezone.now()
    [first] = run_jobs_inline(now=now)
    assert first.outcome is FinishOutcome.SNOOZED
    snap = JobScope(SCOPE).get("s")
    assert (snap.status, snap.attempt_count) == (JobStatus.QUEUED, 0)
    assert snap.next_run_at == now + timedelta(seconds=60)
    assert run_jobs_inline(now=now + timedelta(seconds=59)) == []  # not due yet
    run_jobs_inline(now=now + timedelta(seconds=60))
    runs = run_jobs_inline(now=now + timedelta(seconds=120))
    assert [r.outcome for r in runs] == [FinishOutcome.SUCCEEDED]
    snap = JobScope(SCOPE).get("s")
    assert (snap.status, snap.attempt_count, snap.result_ref) == (JobStatus.SUCCEEDED, 1, "done")
    # Every execution has its attempt row; only the last one counted.
    assert [(a.number, a.status) for a in snap.attempts] == [
        (1, AttemptStatus.SNOOZED),
        (2, AttemptStatus.SNOOZED),
        (3, AttemptStatus.SUCCEEDED),
    ]
    assert seen == [(1, 1), (1, 1), (1, 1)]
    assert Job.objects.get(job_id="s").snooze_count == 2


@pytest.mark.django_db(transaction=True)
def test_a_cancel_requested_first_ends_a_snoozing_job_cancelled(make_job):
    claim = make_job.running("c")
    assert make_job.scope
    JobScope(make_job.scope).cancel("c")
    assert execution.snooze(claim.token, timezone.now()) is FinishOutcome.CANCELLED
    assert make_job.get("c").status == JobStatus.CANCELLED
    assert make_job.attempts("c")[0].status == AttemptStatus.CANCELLED
    # A late snooze with the same token changes nothing.
    assert execution.snooze(claim.token, timezone.now()) is FinishOutcome.STALE


def test_snooze_takes_a_number_of_seconds():
    for bad in (-1, "5", True, 10**9):
        with pytest.raises(InvalidInput):
            Snooze(bad)
    assert Snooze(1.5).seconds == 1.5


@pytest.mark.django_db(transaction=True)
def test_snoozes_never_use_up_max_attempts_but_failures_do(handler):
    """max_attempts=2: a failure, a snooze, a failure — the job ends Failed after its
    two attempts, the snooze between them not counted; a third execution never runs."""
    seen: list[int] = []

    @handler("flow.moody", retry=RetryPolicy(base_delay=1, jitter=0))
    def run(ctx):
        seen.append(ctx.attempt)
        if len(seen) == 2:
            raise Snooze(10)
        raise RuntimeError(f"execution {len(seen)}")

    submit_job(SCOPE, "m", JobSubmission.create("flow.moody", max_attempts=2))
    now = timezone.now()
    outcomes = [
        [r.outcome for r in run_jobs_inline(now=now + timedelta(seconds=at))]
        for at in (0, 5, 20, 40)
    ]
    assert outcomes == [
        [FinishOutcome.REQUEUED],
        [FinishOutcome.SNOOZED],
        [FinishOutcome.FAILED],
        [],
    ]
    assert seen == [1, 2, 2]
    snap = JobScope(SCOPE).get("m")
    assert (snap.status, snap.attempt_count, snap.max_attempts) == (JobStatus.FAILED, 2, 2)
    assert [(a.number, a.status) for a in snap.attempts] == [
        (1, AttemptStatus.FAILED),
        (2, AttemptStatus.SNOOZED),
        (3, AttemptStatus.FAILED),
    ]
    assert Job.objects.get(job_id="m").snooze_count == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_snoozes_a_job_counts_it_and_runs_it_again(handler):
    runs: list[int] = []

    @handler("flow.nap")
    def nap(ctx):
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise Snooze(0)  # due again at once: the same burst runs it
        return "rested"

    submit_job(SCOPE, "n", JobSubmission.create("flow.nap"))
    events: list[tuple[str, str]] = []
    worker = Worker(
        burst=True,
        listen=False,
        on_event=lambda event, claim, detail: events.append((event, claim.job_id if claim else "")),
    )
    worker.run()
    assert runs == [1, 1]
    assert ("snoozed", "n") in events
    assert (worker.stats.snoozed, worker.stats.succeeded, worker.stats.claimed) == (1, 1, 2)
    assert "snoozed 1" in worker.stats.summary()
    snap = JobScope(SCOPE).get("n")
    assert (snap.status, snap.result_ref, snap.attempt_count) == (JobStatus.SUCCEEDED, "rested", 1)


@pytest.mark.django_db(transaction=True)
def test_a_finish_in_the_claims_round_trip_frees_its_slot_and_a_stale_one_does_not(handler):
    """max_running=1. Finishing the Running attempt and claiming in one round trip
    takes the next job at once; a stale finish (its job recovered and Running again
    under another token) frees nothing, so nothing more is claimed."""
    handler("flow.solo", max_running=1)(lambda ctx: None)
    submit(3, "flow.solo", max_attempts=3)
    [first] = execution.claim_due("w", limit=5)
    outcomes, [second] = execution.complete_and_claim([(first, None)], "w", limit=5)
    assert outcomes == {first.token: FinishOutcome.SUCCEEDED}
    assert running("flow.solo") == 1
    assert execution.recover(second.token) is FinishOutcome.REQUEUED
    third = execution.try_start(second.scope_hash, second.job_id, "w")
    assert third is not None
    outcomes, claims = execution.complete_and_claim([(second, None)], "w", limit=5)
    assert outcomes == {second.token: FinishOutcome.STALE}
    assert claims == []
    assert running("flow.solo") == 1


@pytest.mark.django_db(transaction=True)
def test_a_claim_with_room_under_every_limit_claims_plainly_and_one_without_picks(handler):
    """max_running=5, claims of 3: the first has room for 3 more under the limit
    (the plain choice); the second has not, picks, and takes only the 2 left."""
    handler("flow.five", max_running=5)(lambda ctx: None)
    submit(10, "flow.five")
    assert len(execution.claim_due("w", limit=3)) == 3
    assert len(execution.claim_due("w", limit=3)) == 2
    assert execution.claim_due("w", limit=3) == []
    assert running("flow.five") == 5


@pytest.mark.django_db(transaction=True)
def test_a_burst_waits_for_due_jobs_a_rate_holds_back_and_then_exits(handler):
    starts: list[int] = []

    @handler("flow.burst.rated", rate=(3, 1))
    def rated(ctx):
        starts.append(ctx.payload["n"])
        return "ok"

    submit(5, "flow.burst.rated", prefix="b")
    worker = Worker(burst=True, listen=False, concurrency=2)
    worker.run()
    # The first claim takes three: the other two are due but over the rate until its
    # window moves on; a burst that stopped at the first empty claim left them Queued.
    assert sorted(starts) == [0, 1, 2, 3, 4]
    assert worker.stats.succeeded == 5
    assert not Job.objects.filter(handler="flow.burst.rated").exclude(status=JobStatus.SUCCEEDED)
    times = sorted(
        JobAttempt.objects.filter(job__handler="flow.burst.rated").values_list(
            "started_at", flat=True
        )
    )
    assert times[3] - times[0] >= timedelta(seconds=1)


@pytest.mark.django_db(transaction=True)
def test_a_burst_does_not_wait_for_a_paused_queue_under_limits(handler):
    @handler("flow.burst.paused", rate=(3, 1))
    def rated(ctx):
        return "ok"

    submit(2, "flow.burst.paused", prefix="p", queue="held")
    execution.pause_queue("held")
    worker = Worker(burst=True, listen=False)
    worker.run()
    assert worker.stats.claimed == 0
    assert Job.objects.filter(handler="flow.burst.paused", status=JobStatus.QUEUED).count() == 2


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_a_pipelined_statement_binds_each_name_once_and_keeps_a_literal_percent():
    from django.db import transaction

    from jobs.db import fetch_results

    statement = "SELECT %(a)s::int AS a, %(b)s::text AS b, %(a)s::int + 1 AS c, 'x%%' AS d"
    with transaction.atomic():
        rows = fetch_results(connection, [statement], {"a": 1, "b": "y"}, prepare=[statement])
    assert rows == [[{"a": 1, "b": "y", "c": 2, "d": "x%"}]]


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_waited_for_a_limits_lock_is_timed_when_it_held_it(
    handler, background, blocked_on_lock, monkeypatch
):
    """PostgreSQL: a claim made the exact way waits for its limits' advisory lock;
    it is timed once it holds it. Timed before the wait, a window that had room by
    then would still look full (or, after a long wait, miss starts its row dropped),
    and its starts would read as made before those it followed."""
    from ledon import clock

    handler("flow.window", rate=(5, 1))(lambda ctx: None)
    submit(10, "flow.window")
    taken: list[list[int]] = []
    lock_ids = limits_store.lock_ids

    def noted(names):
        ids = lock_ids(names)
        taken.append(ids)
        return ids

    monkeypatch.setattr(limits_store, "lock_ids", noted)
    first = execution.claim_due("w", limit=10)
    assert len(first) == 5  # the window is full: the rate binds, the next claim is exact
    (ids,) = {tuple(ids) for ids in taken if ids}
    base = max(claim.started_at for claim in first)
    shown = {"time": base}
    claim_read_the_clock = threading.Event()
    main = threading.current_thread()

    def fake_now():
        if threading.current_thread() is not main:
            claim_read_the_clock.set()
        return shown["time"]

    monkeypatch.setattr(clock, "now", fake_now)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) AS k", [list(ids)]
        )
        later = background(lambda: execution.claim_due("w", limit=10))
        assert claim_read_the_clock.wait(30)
        # Watched from a connection of its own: this transaction's view of the
        # server's activity is the one it took first.
        background(blocked_on_lock).result(timeout=30)
        shown["time"] = base + timedelta(seconds=5)  # the window has room again
    second = later.result(timeout=60)
    assert len(second) == 5
    assert min(claim.started_at for claim in second) >= base + timedelta(seconds=5)
