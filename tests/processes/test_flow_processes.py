"""Timeouts and flow control with real ``run_jobs`` processes: limits kept across three worker
processes claiming at the same instant (with the claim's lock or without it, and with
the claims' commits held back), per-scope fairness, a rate and rates per key with a
burst and costs measured from attempt start times, a paused queue skipped by every
worker, and a timed-out handler's slot running the next job — on SQLite and
PostgreSQL."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection

from jobs import JobScope, JobStatus, JobSubmission, execution, submit_job, submit_jobs
from jobs.models import Job, JobAttempt
from jobs.types import AttemptStatus
from tests.support.procs import WorkerProcess, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCOPE = "flow-processes"
FLOW = {"FLOW_TASKS": "1", "JOBS_POLL_INTERVAL": "0.05", "JOBS_SCHEDULER": "false"}


@pytest.fixture
def workers(tmp_path: Path):
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        proc = WorkerProcess(tmp_path, *args, env={**FLOW, **(env or {})})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def _stop(*procs: WorkerProcess) -> None:
    for proc in procs:
        proc.signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait() == 0, proc.output


def _three_meeting_at(point: str, workers, tmp_path: Path, **env: str) -> list[WorkerProcess]:
    """Three workers of 8 threads whose first claims under limits meet at ``point``
    (a barrier across the processes), so that they claim at the same instant."""
    meet = tmp_path / f"meet-{point}"
    meet.mkdir()
    fault = {"JOBS_FAULT": f"{point}@1:barrier:{meet}:3", **env}
    return [workers("--concurrency", "8", env=fault) for _ in range(3)]


class MostRunning:
    """A sampler on the test's own connection: the most Running jobs of ``handler``
    it saw at once, in all and per scope."""

    def __init__(self, handler: str) -> None:
        self.handler = handler
        self.most = 0
        self.most_per_scope = 0
        self.most_scopes = 0

    def sample(self) -> None:
        scopes = Counter(
            Job.objects.filter(handler=self.handler, status=JobStatus.RUNNING).values_list(
                "scope_hash", flat=True
            )
        )
        self.most = max(self.most, sum(scopes.values()))
        self.most_per_scope = max(self.most_per_scope, max(scopes.values(), default=0))
        self.most_scopes = max(self.most_scopes, len(scopes))


def succeeded(handler: str) -> int:
    return Job.objects.filter(handler=handler, status=JobStatus.SUCCEEDED).count()


def test_max_running_holds_across_three_worker_processes(workers, tmp_path):
    """300 jobs of a handler with max_running=2, three processes of 8 threads whose
    first claims start together: the sampler never sees more than 2 Running. (Whoever
    holds the slots keeps them as it finishes and claims in one transaction; the
    others' claims, taking the same lock, find them full.)"""
    for n in range(300):
        submit_job(SCOPE, f"l{n}", JobSubmission.create("flow.limited", {"seconds": 0.02}))
    procs = _three_meeting_at("jobs.claim.limited", workers, tmp_path)
    sampler = MostRunning("flow.limited")

    def done() -> bool:
        sampler.sample()
        return succeeded("flow.limited") == 300

    wait_until(done, 240, "300 jobs to succeed", procs[0])
    _stop(*procs)
    assert sampler.most == 2  # reached, never passed
    assert JobAttempt.objects.filter(job__handler="flow.limited").count() == 300


#: The advisory lock a held commit waits for (a claim's locks are 64-bit hashes).
HOLD = 72_018


@contextmanager
def commits_held() -> Iterator[Callable[[], None]]:
    """PostgreSQL: every transaction that inserts an attempt row — every claim —
    waits at its COMMIT (a deferred trigger takes a lock this connection holds)
    until the function yielded is called; its claim is made, not yet visible."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION flow_test_hold() RETURNS trigger LANGUAGE plpgsql AS"
            f" $$ BEGIN PERFORM pg_advisory_xact_lock_shared({HOLD}); RETURN NULL; END $$"
        )
        cursor.execute(
            "CREATE CONSTRAINT TRIGGER flow_test_hold AFTER INSERT ON jobs_jobattempt"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION flow_test_hold()"
        )
        cursor.execute("SELECT pg_advisory_lock(%s)", [HOLD])
    held = [True]

    def release() -> None:
        if held.pop() if held else False:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [HOLD])

    try:
        yield release
    finally:
        release()
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER flow_test_hold ON jobs_jobattempt")
            cursor.execute("DROP FUNCTION flow_test_hold()")


def lock_waits() -> tuple[int, int, int]:
    """Backends waiting at a held commit, waiting for a claim's advisory lock, and
    waiting for another transaction (a limit counter's row another claim changed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE locktype = 'advisory' AND classid = 0 AND objid = %s),"
            " count(*) FILTER (WHERE locktype = 'advisory'"
            " AND NOT (classid = 0 AND objid = %s)),"
            " count(DISTINCT pid) FILTER (WHERE locktype <> 'advisory')"
            " FROM pg_locks WHERE NOT granted",
            [HOLD, HOLD],
        )
        at_commit, at_claim, at_counter = cursor.fetchone()
    return at_commit, at_claim, at_counter


@pytest.mark.postgres_only
@pytest.mark.parametrize("guarded", [True, False], ids=["locked", "without-the-lock"])
def test_claims_whose_commits_are_held_back_keep_the_limit_with_or_without_the_lock(
    workers, guarded
):
    """Three workers of 8 threads, max_running=2, every claim's commit held back.
    Each claim is first made without a lock, asking for 8 jobs: past the cap of 2,
    the counter's constraint refuses it whole, and it is made again the exact way.
    With the handler's advisory lock, the first exact claim holds it at its commit
    and the two others wait for it. Without it (``FLOW_UNGUARDED``) the two others
    wait for the counter's row the first one changed; once it commits, each finds
    no room (or goes past the cap, changes nothing and is made again): a counter's
    cap alone keeps ``max_running``."""
    for n in range(24):
        submit_job(SCOPE, f"l{n}", JobSubmission.create("flow.limited", {"seconds": 0.5}))
    env = {} if guarded else {"FLOW_UNGUARDED": "1"}
    sampler = MostRunning("flow.limited")
    with commits_held() as release:
        procs = [workers("--concurrency", "8", env=env) for _ in range(3)]
        expected = (1, 2, 0) if guarded else (1, 0, 2)
        wait_until(lambda: lock_waits() == expected, 60, f"lock waits {expected}", procs[0])
        release()

        def over_or_done() -> bool:
            sampler.sample()
            return sampler.most > 2 or succeeded("flow.limited") == 24

        wait_until(over_or_done, 120, "the limit to break or every job", procs[0])
        assert sampler.most == 2
        _stop(*procs)
    assert sampler.most == 2
    assert succeeded("flow.limited") == 24


def test_max_running_per_scope_keeps_one_per_scope_and_no_scope_starves(workers, tmp_path):
    """Five scopes, the first one's 30 jobs queued ahead of the four others' 4 each:
    never more than one Running per scope, and the four small scopes finish while
    the first one's jobs still go one at a time (nothing waits behind its head)."""
    scopes = [f"tenant-{c}" for c in "abcde"]
    for scope, count in zip(scopes, (30, 4, 4, 4, 4), strict=True):
        for n in range(count):
            submit_job(scope, f"p{n}", JobSubmission.create("flow.per_tenant", {"seconds": 0.1}))
    first = Job.objects.filter(job_id="p0").order_by("id").first()
    assert first is not None
    big = first.scope_hash
    procs = _three_meeting_at("jobs.claim.limited", workers, tmp_path)
    sampler = MostRunning("flow.per_tenant")
    per_tenant = Job.objects.filter(handler="flow.per_tenant")

    def small_ones_done() -> bool:
        sampler.sample()
        return per_tenant.exclude(scope_hash=big).filter(status=JobStatus.SUCCEEDED).count() == 16

    wait_until(small_ones_done, 120, "the four small scopes", procs[0])
    # The big scope runs one at a time: 30 jobs of 0.1 s cannot be done yet.
    assert per_tenant.filter(scope_hash=big, status=JobStatus.SUCCEEDED).count() < 30

    def all_done() -> bool:
        sampler.sample()
        return succeeded("flow.per_tenant") == 46

    wait_until(all_done, 120, "every scope", procs[0])
    _stop(*procs)
    assert sampler.most_per_scope == 1
    assert sampler.most_scopes >= 2  # scopes ran side by side


def test_three_worker_processes_never_run_two_jobs_of_one_limit_key(workers, tmp_path):
    """max_running_per_key=1, three keys spread over two scopes, three processes of 8
    threads whose first claims meet: the sampler never sees two Running jobs of one
    key, and sees keys run side by side."""
    for n in range(30):
        sub = JobSubmission.create("flow.per_key", {"seconds": 0.02}, limit_key=f"acct-{n % 3}")
        submit_job(f"tenant-{n % 2}", f"k{n}", sub)
    procs = _three_meeting_at("jobs.claim.limited", workers, tmp_path)
    most_per_key = most_keys = 0

    def done() -> bool:
        nonlocal most_per_key, most_keys
        keys = Counter(
            Job.objects.filter(handler="flow.per_key", status=JobStatus.RUNNING).values_list(
                "limit_key", flat=True
            )
        )
        most_per_key = max(most_per_key, max(keys.values(), default=0))
        most_keys = max(most_keys, len(keys))
        return succeeded("flow.per_key") == 30

    wait_until(done, 120, "30 keyed jobs", procs[0])
    _stop(*procs)
    assert most_per_key == 1
    assert most_keys >= 2


def test_two_workers_start_a_small_scope_next_to_a_big_backlog(workers):
    """Fair share with two real worker processes: one scope's 300 jobs, then a
    second scope's 5, submitted after them. Sorted by start, the small scope's last
    job is among the first 30 starts — in submission order it would be the 305th."""
    submit_jobs(
        [("tenant-big", f"b{n}", JobSubmission.create("flow.fair", {})) for n in range(300)]
    )
    for n in range(5):
        submit_job("tenant-small", f"s{n}", JobSubmission.create("flow.fair", {}))
    procs = [workers("--concurrency", "2") for _ in range(2)]
    wait_until(lambda: succeeded("flow.fair") == 305, 120, "305 jobs", procs[0])
    _stop(*procs)
    order = list(
        JobAttempt.objects.filter(job__handler="flow.fair")
        .order_by("started_at", "id")
        .values_list("job__scope_hash", flat=True)
    )
    small = JobScope("tenant-small").scope_hash
    assert len(order) == 305
    assert max(n for n, scope in enumerate(order) if scope == small) < 30, order[:40]


def test_a_worker_expires_a_job_not_started_by_its_deadline(workers):
    """A job due only after its start deadline: the worker never starts it, and its
    periodic sweep ends it Expired, with no attempt; a job beside it runs."""
    from django.utils import timezone

    late = JobSubmission.create(
        "flow.fair", {}, not_before=timezone.now() + timedelta(seconds=1), start_within=0.3
    )
    submit_job(SCOPE, "too-late", late)
    submit_job(SCOPE, "in-time", JobSubmission.create("flow.fair", {}, start_within=60))
    proc = workers("--concurrency", "2", env={"JOBS_RECOVERY_INTERVAL": "0.1"})
    expired = Job.objects.filter(job_id="too-late", status=JobStatus.EXPIRED)
    wait_until(expired.exists, 30, "the late job to expire", proc)
    wait_until(lambda: succeeded("flow.fair") == 1, 30, "the job in time", proc)
    _stop(proc)
    assert not JobAttempt.objects.filter(job__job_id="too-late").exists()


def test_a_rate_holds_in_every_window_of_attempt_start_times(workers, tmp_path):
    """rate=(20, 1) and 70 jobs over three processes: sorted by start time, any 21
    consecutive starts span at least one second — no window of 1 s holds more than
    20 — and some 20 fall within one (the rate was reached, not just undercut)."""
    for n in range(70):
        submit_job(SCOPE, f"r{n}", JobSubmission.create("flow.rated", {}))
    procs = _three_meeting_at("jobs.claim.limited", workers, tmp_path)
    wait_until(lambda: succeeded("flow.rated") == 70, 120, "70 rated jobs", procs[0])
    _stop(*procs)
    starts = sorted(
        JobAttempt.objects.filter(job__handler="flow.rated").values_list("started_at", flat=True)
    )
    assert len(starts) == 70
    second = timedelta(seconds=1)
    assert all(starts[i + 20] - starts[i] >= second for i in range(len(starts) - 20))
    assert any(starts[i + 19] - starts[i] < second for i in range(len(starts) - 19))


def _starts_by_key(handler: str) -> dict[str, list[datetime]]:
    """Each limit key's attempt start times, sorted, with each start repeated for its
    job's cost (a unit each)."""
    starts: dict[str, list[datetime]] = {}
    rows = JobAttempt.objects.filter(job__handler=handler).values_list(
        "job__limit_key", "job__cost", "started_at"
    )
    for key, cost, started in rows:
        starts.setdefault(key, []).extend([started] * cost)
    return {key: sorted(times) for key, times in starts.items()}


def _microseconds(span: timedelta) -> int:
    return span // timedelta(microseconds=1)


@pytest.mark.parametrize("fault", ["barrier", "without-the-lock"])
def test_worker_processes_never_over_admit_a_rate_per_key(workers, tmp_path, fault):
    """Three processes of 8 threads whose first claims meet, jobs of three keys with
    costs 1 to 3: per key, the token bucket ``(10, 1, 5)`` — no span of time W holds
    more than 5 + 10·W units — and the window ``(5, 1)`` — no second holds more than 5
    starts —, measured from the attempts' start times as the database holds them
    (each start taken by its claim's clock; all processes read one machine's). Each
    key's bucket let a burst through (more units in some span than the average alone
    admits) and each key's window filled. Without the advisory lock (``FLOW_UNGUARDED``)
    the rows' constraints keep the rates alone."""
    env = {"FLOW_UNGUARDED": "1"} if fault == "without-the-lock" else {}
    units: Counter[str] = Counter()
    for n in range(60):
        key, cost = f"acct-{n % 3}", 1 + (n // 3) % 3
        units[key] += cost
        sub = JobSubmission.create("flow.key_rated", {}, limit_key=key, cost=cost)
        submit_job(f"tenant-{n % 2}", f"b{n}", sub)
        submit_job(
            f"tenant-{n % 2}", f"w{n}", JobSubmission.create("flow.key_window", {}, limit_key=key)
        )
    procs = _three_meeting_at("jobs.claim.limited", workers, tmp_path, **env)
    wait_until(
        lambda: succeeded("flow.key_rated") + succeeded("flow.key_window") == 120,
        240,
        "120 key-rated jobs",
        procs[0],
    )
    _stop(*procs)
    interval = 100_000  # microseconds between two units of (10, 1, 5)
    bucket = _starts_by_key("flow.key_rated")
    assert {key: len(times) for key, times in bucket.items()} == units
    for key, times in bucket.items():
        burst = False
        for i, first in enumerate(times):
            for j in range(i, len(times)):
                span = _microseconds(times[j] - first)
                assert (j - i + 1) * interval <= 5 * interval + span, (key, i, j, span)
                burst = burst or (j - i) * interval > span
        assert burst, key
    window = _starts_by_key("flow.key_window")
    second = timedelta(seconds=1)
    assert {key: len(times) for key, times in window.items()} == dict.fromkeys(units, 20)
    for key, times in window.items():
        assert all(times[i + 5] - times[i] >= second for i in range(len(times) - 5)), key
        assert any(times[i + 4] - times[i] < second for i in range(len(times) - 4)), key


def test_a_paused_queue_is_skipped_by_every_worker_until_resumed(workers):
    """Queue "emails" paused with ten jobs queued; two workers run the default
    queue's jobs and claim on and on, and nothing of "emails" starts until resumed."""
    assert execution.pause_queue("emails")
    for n in range(10):
        submit_job(SCOPE, f"mail-{n}", JobSubmission.create("test.record", {}, queue="emails"))
    procs = [workers("--concurrency", "2") for _ in range(2)]
    for proc in procs:
        proc.wait_for_output("handlers")  # claiming from now on
    for n in range(10):
        submit_job(SCOPE, f"other-{n}", JobSubmission.create("test.record", {}))

    def others_done() -> bool:
        return Job.objects.filter(queue="default", status=JobStatus.SUCCEEDED).count() == 10

    wait_until(others_done, 60, "the default queue's jobs", procs[0])
    mails = Job.objects.filter(queue="emails")
    assert Counter(mails.values_list("status", flat=True)) == {JobStatus.QUEUED: 10}
    assert not any(mails.values_list("attempt_count", flat=True))
    assert not JobAttempt.objects.filter(job__queue="emails").exists()
    assert execution.resume_queue("emails")
    wait_until(
        lambda: mails.filter(status=JobStatus.SUCCEEDED).count() == 10, 60, "the mails", procs[0]
    )
    _stop(*procs)


def test_a_timed_out_handler_fails_and_its_slot_runs_the_next_job(workers, tmp_path):
    """One slot; a handler that ignores its timeout (0.5 s) and waits on. After the
    grace the attempt fails with JobTimedOut and the next job runs in a fresh thread
    while the abandoned handler still waits; its late progress and return change
    nothing."""
    gate, done = tmp_path / "gate", tmp_path / "done"
    payload = {"gate": str(gate), "done": str(done)}
    submit_job(SCOPE, "stubborn", JobSubmission.create("flow.stubborn", payload, priority=1))
    submit_job(SCOPE, "next", JobSubmission.create("test.record", {}))
    worker = workers("--concurrency", "1", env={"JOBS_TIMEOUT_GRACE_SECONDS": "0.2"})
    wait_until(
        lambda: Job.objects.get(job_id="next").status == JobStatus.SUCCEEDED, 30, "next", worker
    )
    assert not done.exists()  # the stubborn handler is still waiting
    stubborn = Job.objects.get(job_id="stubborn")
    assert stubborn.status == JobStatus.FAILED
    assert "JobTimedOut" in stubborn.error
    assert stubborn.attempts.get().status == AttemptStatus.FAILED
    gate.touch()  # now it reports progress and returns, too late
    # The handler creates the file, then writes it: wait for what it wrote.
    wait_until(lambda: done.exists() and done.read_text(), 30, "the late return", worker)
    assert done.read_text() == "False"  # its progress was refused (fenced by its token)
    _stop(worker)
    stubborn.refresh_from_db()
    assert (stubborn.status, stubborn.result_ref, stubborn.progress) == (
        JobStatus.FAILED,
        None,
        None,
    )
    assert stubborn.attempts.get().status == AttemptStatus.FAILED
