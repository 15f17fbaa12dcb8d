"""Claiming: due candidates, try_start, batch claims, claim races, the claim index."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from jobs import execution, store
from jobs.api import JobScope, stage_job
from jobs.conf import jobs_settings
from jobs.exceptions import InvalidScope, JobsConfigurationError
from jobs.models import Job, JobAttempt
from jobs.store import sql, sql_limits
from jobs.types import AttemptStatus, FinishOutcome, JobStatus
from tests.support.factories import JobSubmissionFactory, write_job_rows

SCOPE = "tenant-42"
T0 = datetime(2024, 3, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.django_db
class TestGetDue:
    def test_ordered_by_priority_then_time(self, make_job, submission_order) -> None:
        make_job.queued("a", priority=0, not_before=T0 + timedelta(seconds=2))
        make_job.queued("b", priority=5, not_before=T0 + timedelta(seconds=3))
        make_job.queued("c", priority=5, not_before=T0 + timedelta(seconds=1))
        make_job.queued("d", priority=-1, not_before=T0)
        make_job.queued("e", priority=100, not_before=T0 + timedelta(days=1))

        due = execution.get_due()
        assert [d.job_id for d in due] == ["e", "c", "b", "a", "d"]
        assert [d.priority for d in due] == [100, 5, 5, 0, -1]
        assert due[1].next_run_at == T0 + timedelta(seconds=1)
        assert due[1].scope_hash == make_job.scope_hash
        assert (due[1].handler, due[1].handler_version) == ("reports.generate", 1)

    def test_excludes_what_cannot_be_claimed(self, make_job, scope) -> None:
        make_job.queued("due", not_before=T0)
        make_job.queued("future", not_before=timezone.now() + timedelta(hours=1))
        make_job.running("running")
        make_job.queued("cancelled")
        scope.cancel("cancelled")
        make_job.finished(JobStatus.SUCCEEDED, "succeeded")
        # States the store never produces, set here to prove the guard itself.
        make_job.queued("flagged")
        Job.objects.filter(job_id="flagged").update(cancel_requested=True)
        make_job.queued("exhausted")
        Job.objects.filter(job_id="exhausted").update(attempt_count=1)

        assert [d.job_id for d in execution.get_due()] == ["due"]
        assert [d.job_id for d in store.get_due(now=T0 - timedelta(microseconds=1))] == []
        for job_id in ("flagged", "exhausted", "future"):
            assert execution.try_start(make_job.scope_hash, job_id) is None

    def test_limit_and_queues(self, make_job, settings) -> None:
        settings.JOBS = {
            **settings.JOBS,
            "QUEUES": {q: {"fair": False} for q in ("default", "slow")},
        }
        for n in range(5):
            make_job.queued(f"d{n}", queue="default", not_before=T0 + timedelta(seconds=n))
        for n in range(3):
            make_job.queued(f"s{n}", queue="slow", not_before=T0 + timedelta(seconds=n))

        assert [d.job_id for d in execution.get_due(limit=2)] == ["d0", "s0"]
        assert [d.job_id for d in execution.get_due(queues=["slow"])] == ["s0", "s1", "s2"]
        assert len(execution.get_due(queues=["slow", "default"])) == 8
        assert execution.get_due(queues=["none"]) == []

    def test_grants_nothing(self, make_job, unchanged) -> None:
        make_job.queued("job-1")
        with unchanged():
            assert len(execution.get_due()) == 1
            assert len(execution.get_due()) == 1


@pytest.mark.django_db
class TestTryStart:
    def test_claim_starts_the_job_and_its_attempt(self, make_job) -> None:
        make_job.queued("job-1", payload={"x": 1}, max_attempts=3, queue="q1")
        now = timezone.now()
        claim = execution.try_start(make_job.scope_hash, "job-1", "w1", now=now, lease_seconds=60)

        assert claim is not None
        assert len(claim.token) == 32
        int(claim.token, 16)
        assert (claim.scope_hash, claim.job_id) == (make_job.scope_hash, "job-1")
        assert (claim.attempt, claim.max_attempts, claim.attempts_left) == (1, 3, 2)
        assert (claim.handler, claim.handler_version, claim.queue) == ("reports.generate", 1, "q1")
        assert claim.payload == {"x": 1}
        assert claim.worker_id == "w1"
        assert claim.lease_expires_at == now + timedelta(seconds=60)

        job = make_job.row("job-1")
        assert job.status == JobStatus.RUNNING
        assert job.attempt_count == 1
        assert job.current_token == claim.token
        assert job.leased_by == "w1"
        assert job.lease_expires_at == now + timedelta(seconds=60)
        assert job.started_at == now
        [attempt] = make_job.attempts("job-1")
        assert attempt.number == 1
        assert attempt.token == claim.token
        assert attempt.status == AttemptStatus.RUNNING
        assert attempt.worker_id == "w1"
        assert attempt.started_at == now
        assert attempt.finished_at is None

    def test_claim_and_attempt_row_are_written_together(self, make_job, unchanged) -> None:
        # An attempt row the store would never leave behind makes the insert fail;
        # the job's own update must be rolled back with it.
        make_job.queued("job-1")
        JobAttempt.objects.create(
            job=make_job.row("job-1"), number=1, token="stray", started_at=timezone.now()
        )
        with unchanged(), pytest.raises(IntegrityError):
            execution.try_start(make_job.scope_hash, "job-1")
        assert make_job.row("job-1").status == JobStatus.QUEUED

    def test_second_try_start_gets_nothing(self, make_job, unchanged) -> None:
        make_job.running("job-1")
        with unchanged():
            assert execution.try_start(make_job.scope_hash, "job-1", "w2") is None

    def test_unknown_job_and_other_scope_get_nothing(self, make_job) -> None:
        make_job.queued("job-1")
        assert execution.try_start(make_job.scope_hash, "job-2") is None
        assert execution.try_start(JobScope("tenant-43").scope_hash, "job-1") is None
        assert make_job.row("job-1").status == JobStatus.QUEUED

    @pytest.mark.parametrize("scope_hash", ["tenant-42", "A" * 64, "", "0" * 63])
    def test_a_scope_name_is_not_a_scope_hash(self, make_job, scope_hash: str) -> None:
        make_job.queued("job-1")
        with pytest.raises(InvalidScope):
            execution.try_start(scope_hash, "job-1")
        assert make_job.row("job-1").status == JobStatus.QUEUED

    def test_every_attempt_gets_a_new_token(self, make_job, scope) -> None:
        tokens = []
        make_job.queued("job-1", max_attempts=3)
        for number in (1, 2, 3):
            claim = execution.try_start(make_job.scope_hash, "job-1")
            assert claim is not None
            assert claim.attempt == number
            tokens.append(claim.token)
            execution.fail(claim.token, "boom")
            if number < 3:
                scope.retry("job-1")
        assert len(set(tokens)) == 3
        assert [a.token for a in make_job.attempts("job-1")] == tokens


@pytest.mark.django_db
class TestClaimDue:
    def test_batch_claims_in_priority_order(self, make_job) -> None:
        for n in range(5):
            make_job.queued(f"j{n}", priority=n, not_before=T0)

        first = execution.claim_due("w1", limit=3)
        assert [c.job_id for c in first] == ["j4", "j3", "j2"]
        second = execution.claim_due("w2", limit=3)
        assert [c.job_id for c in second] == ["j1", "j0"]
        assert execution.claim_due("w3", limit=3) == []

        assert Job.objects.filter(status=JobStatus.RUNNING).count() == 5
        attempts = JobAttempt.objects.all()
        assert {(a.job.job_id, a.number, a.token, a.worker_id) for a in attempts} == {
            (c.job_id, 1, c.token, c.worker_id) for c in first + second
        }
        assert len({c.token for c in first + second}) == 5

    def test_batch_respects_queues(self, make_job) -> None:
        make_job.queued("a", queue="fast")
        make_job.queued("b", queue="slow")
        claims = execution.claim_due("w1", limit=10, queues=["slow"])
        assert [c.job_id for c in claims] == ["b"]
        assert make_job.row("a").status == JobStatus.QUEUED


@pytest.mark.django_db(transaction=True)
class TestClaimRaces:
    def test_many_workers_try_start_one_job(self, make_job, concurrently) -> None:
        make_job.queued("job-1")
        scope_hash = make_job.scope_hash

        def start(worker: int):
            return lambda: execution.try_start(scope_hash, "job-1", f"w{worker}")

        outcomes = concurrently(*[start(n) for n in range(8)])
        assert [o.error for o in outcomes] == [None] * 8
        claims = [o.value for o in outcomes if o.value is not None]
        assert len(claims) == 1
        job = make_job.row("job-1")
        assert (job.status, job.attempt_count, job.current_token) == (
            JobStatus.RUNNING,
            1,
            claims[0].token,
        )
        assert JobAttempt.objects.get().token == claims[0].token

    def test_workers_share_a_queue_without_double_claims(self, concurrently) -> None:
        with transaction.atomic():
            for n in range(100):
                stage_job(SCOPE, f"job-{n}", JobSubmissionFactory(priority=n % 3))

        def drain(worker: str):
            def run() -> list[str]:
                claimed: list[str] = []
                while batch := execution.claim_due(worker, limit=10):
                    claimed.extend(c.job_id for c in batch)
                return claimed

            return run

        outcomes = concurrently(*[drain(f"w{n}") for n in range(4)])
        assert [o.error for o in outcomes] == [None] * 4
        claimed = [job_id for o in outcomes for job_id in o.value]
        assert sorted(claimed) == sorted(f"job-{n}" for n in range(100))
        assert Job.objects.filter(status=JobStatus.RUNNING, attempt_count=1).count() == 100
        assert JobAttempt.objects.count() == 100
        assert JobAttempt.objects.filter(number=1).count() == 100


@pytest.mark.django_db
@pytest.mark.postgres_only
class TestClaimIndex:
    """The claim query reads its partial index, so finished history never slows it."""

    @pytest.fixture
    def history(self) -> None:
        now = timezone.now()
        write_job_rows(
            2000,
            "old",
            status=JobStatus.SUCCEEDED,
            attempt_count=1,
            next_run_at=lambda n: now - timedelta(days=1, seconds=n),
            finished_at=now,
        )
        write_job_rows(50, "new", next_run_at=lambda n: now - timedelta(seconds=n))
        # The planner's statistics describe these rows, not whatever the table held
        # when autovacuum last analysed it (a plan for mostly-queued rows scans it).
        # The lock is the one ANALYZE itself takes: held until the test's transaction
        # rolls back, it keeps autovacuum from analysing the table again meanwhile,
        # from a snapshot that cannot see these uncommitted rows.
        with connection.cursor() as cursor:
            cursor.execute(f"LOCK TABLE {Job._meta.db_table} IN SHARE UPDATE EXCLUSIVE MODE")
            cursor.execute(f"ANALYZE {Job._meta.db_table}")

    def ask_whether_an_index_serves(self) -> None:
        """Between reading 2,050 rows and a partial index bloated by the tests before,
        the planner's pick is a coin toss; what must hold is that the index can serve
        the query at all. Sequential scans are turned off for the test's transaction:
        were the index's predicate not the query's, the plan would scan the table even
        so."""
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL enable_seqscan = off")

    def explain(self, statement: str, params: dict[str, object]) -> str:
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {statement}", params)
            return "\n".join(row[0] for row in cursor.fetchall())

    def claim_params(self) -> dict[str, object]:
        now = timezone.now()
        return {"worker_id": "w1", "lease_expires_at": now, "now": now, "limit": 10}

    def test_claim_statement_uses_the_line_index(self, history: None) -> None:
        statement = sql.claim(connection.vendor, queues=0, one_job=False)
        self.ask_whether_an_index_serves()
        plan = self.explain(statement, self.claim_params())
        # With 50 Queued rows the planner may as well read the head-of-line index and
        # sort them: both hold Queued rows only, so the history is never read.
        assert "jobs_job_line_idx" in plan, plan
        assert not re.search(r"Seq Scan on jobs_job\s", plan), plan

    def claim_statements(self) -> list[tuple[str, dict[str, object]]]:
        """The claim, alone and finishing a batch, with their parameters."""
        finish: dict[str, object] = {
            "tokens": ["t1", "t2"],
            "outcomes": ["succeeded", "succeeded"],
            "results": [None, "r"],
            "errors": ["", ""],
            "summaries": ["", ""],
            # What follows in batches and sequences (see jobs.store.endings).
            "now_place": 0,
            "channel": "jobs",
            "requeue": False,
        }
        return [
            (
                sql.claim(connection.vendor, queues=0, one_job=False, finishing=finishing),
                {**(finish if finishing else {}), **self.claim_params()},
            )
            for finishing in (False, True)
        ]

    @contextmanager
    def prepared(
        self, statement: str, params: dict[str, object]
    ) -> Iterator[tuple[CursorWrapper, str, list[object]]]:
        """``statement`` prepared as ``ledon_claim_plan``: a cursor, the EXECUTE and
        its arguments."""
        names = list(params)
        numbered = statement % {name: f"${n}" for n, name in enumerate(names, 1)}
        with connection.cursor() as cursor:
            cursor.execute(f"PREPARE ledon_claim_plan AS {numbered}")
            try:
                execute = f"EXECUTE ledon_claim_plan({', '.join(['%s'] * len(names))})"
                yield cursor, execute, [params[name] for name in names]
            finally:
                cursor.execute("DEALLOCATE ledon_claim_plan")

    @pytest.mark.postgres_only
    def test_generic_plan_of_the_prepared_statements_uses_indexes(self, history: None) -> None:
        """The worker runs its claim (and claim-and-finish) as a prepared statement,
        which PostgreSQL may plan once without the parameters' values: that plan too
        must find due jobs through the line index and the claimed rows by primary key,
        never by scanning the table — even with a long queue in the statistics."""
        write_job_rows(5000, "queued", scope_hash="b" * 64)
        for statement, params in self.claim_statements():
            with transaction.atomic(), self.prepared(statement, params) as (cursor, run, args):
                cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                cursor.execute(f"EXPLAIN {run}", args)
                plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "jobs_job_line_idx" in plan, plan
            assert "jobs_job_pkey" in plan, plan
            assert not re.search(r"Seq Scan on jobs_job\s", plan), plan

    @pytest.mark.postgres_only
    def test_the_prepared_claim_is_planned_once(self, history: None) -> None:
        """After five executions of a prepared statement PostgreSQL plans it once for
        good (a generic plan) only if that plan costs no more than the ones it made
        for the parameters' values, planning included; else it plans each execution
        again, which for a claim that also finishes costs more than running it. The
        claim, alone and finishing, keeps its generic plan."""
        for statement, params in self.claim_statements():
            with self.prepared(statement, {**params, "limit": 1}) as (cursor, run, args):
                for _ in range(7):
                    cursor.execute(run, args)
                cursor.execute(
                    "SELECT generic_plans FROM pg_prepared_statements"
                    " WHERE name = 'ledon_claim_plan'"
                )
                assert cursor.fetchone()[0] >= 1, statement[:40]

    def test_recovery_queries_read_the_token_index(self, history: None) -> None:
        """Expired leases and a worker's own attempts are found through the partial
        index of current tokens (only running jobs hold one), never the history."""
        for queryset in (
            Job.objects.lease_expired(timezone.now()).values_list("current_token"),
            Job.objects.running().filter(leased_by="w1").values_list("current_token"),
        ):
            plan = queryset.explain()
            assert "jobs_job_current_token" in plan, plan
            assert "Seq Scan" not in plan, plan

    def test_due_query_uses_the_line_index(self, history: None) -> None:
        self.ask_whether_an_index_serves()
        plan = Job.objects.due(timezone.now()).order_by("-priority", "fair_at", "id")[:10].explain()
        assert "jobs_job_line_idx" in plan, plan
        assert "Seq Scan" not in plan, plan


@pytest.mark.django_db(transaction=True)
class TestPreparedStatements:
    """``JOBS['PREPARED_STATEMENTS']``: on PostgreSQL the claim is prepared once per
    connection, or never; either way it claims the same."""

    def prepared_claims(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                [f"%INSERT INTO {JobAttempt._meta.db_table}%"],
            )
            return int(cursor.fetchone()[0])

    @pytest.mark.postgres_only
    def test_the_claim_is_prepared_once_per_connection(self, make_job) -> None:
        connection.close()
        for n in range(3):
            make_job.queued(f"job-{n}")
            assert [c.job_id for c in execution.claim_due("w1", limit=1)] == [f"job-{n}"]
        assert self.prepared_claims() == 1

    @pytest.mark.postgres_only
    def test_off_prepares_nothing_and_claims_the_same(self, settings, make_job) -> None:
        settings.JOBS = {**settings.JOBS, "PREPARED_STATEMENTS": False}
        connection.close()
        make_job.queued("job-1")
        [claim] = execution.claim_due("w1", limit=1)
        assert claim.job_id == "job-1"
        make_job.queued("job-2")
        outcomes, claims = execution.complete_and_claim([(claim, "r")], "w1", limit=4)
        assert outcomes == {claim.token: FinishOutcome.SUCCEEDED}
        assert [c.job_id for c in claims] == ["job-2"]
        assert self.prepared_claims() == 0

    def test_the_setting_must_be_true_or_false(self, settings) -> None:
        settings.JOBS = {"PREPARED_STATEMENTS": "yes"}
        with pytest.raises(JobsConfigurationError, match="PREPARED_STATEMENTS"):
            jobs_settings()


#: How many Queued jobs a claim may not take lie in line before the ones it may.
BACKLOG = 3000


def rows_read() -> int:
    """PostgreSQL: the rows of ``jobs_job`` its scans read so far in this transaction
    (fetched through an index or read by a sequential scan)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(idx_tup_fetch, 0) + seq_tup_read FROM pg_stat_xact_user_tables"
            " WHERE relname = %s",
            [Job._meta.db_table],
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db
class TestClaimReadsOnlyWhatItMayTake:
    """A claim's cost does not grow with the Queued jobs it may not take — those of a
    paused queue, of a queue it does not serve, of a queue whose limit has no room:
    each queue's line is read from its head, and only the lines it may take from."""

    @pytest.fixture
    def backlog(self) -> datetime:
        """``BACKLOG`` jobs in ``backlog``, all first in claim order (a higher
        priority), and three due jobs in ``probe``."""
        now = timezone.now()
        write_job_rows(BACKLOG, "backlog", queue="backlog", priority=5)
        write_job_rows(3, "probe", queue="probe")
        if connection.vendor == "postgresql":
            # A table of a few thousand rows and no history fits in a few pages, where
            # the planner may as well scan it all: what must hold is that the claim
            # need not.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL enable_seqscan = off")
        return now

    def claim_reading(self, **claim: object) -> tuple[list[str], int]:
        before = rows_read()
        claims = execution.claim_due("w1", limit=10, **claim)  # type: ignore[arg-type]
        return sorted(c.job_id for c in claims), rows_read() - before

    @pytest.mark.postgres_only
    def test_a_paused_backlog_is_not_read(self, backlog: datetime) -> None:
        execution.pause_queue("backlog")
        claimed, read = self.claim_reading()
        assert claimed == ["probe-0", "probe-1", "probe-2"]
        # The probe jobs twice (counted, then locked), and by primary key: a few dozen
        # rows at most, where reading past the backlog is thousands.
        assert read < 50, read

    @pytest.mark.postgres_only
    def test_an_unserved_backlog_is_not_read(self, backlog: datetime) -> None:
        claimed, read = self.claim_reading(queues=["probe"])
        assert claimed == ["probe-0", "probe-1", "probe-2"]
        assert read < 50, read

    @pytest.mark.postgres_only
    def test_a_backlog_its_queue_limit_holds_back_is_not_read(
        self, backlog: datetime, settings: object
    ) -> None:
        settings.JOBS = {"QUEUES": {"backlog": {"max_running": 1}}}  # type: ignore[attr-defined]
        assert len(execution.claim_due("w1", limit=1, queues=["backlog"])) == 1
        claimed, read = self.claim_reading()
        assert claimed == ["probe-0", "probe-1", "probe-2"]
        # The claim first takes the first ten in line, which the queue's counter
        # refuses; then the exact claim leaves the full queue out before reading it.
        assert read < 100, read

    @pytest.mark.skipif("connection.vendor == 'postgresql'")
    @pytest.mark.parametrize("limited", [False, True])
    def test_sqlite_reads_each_line_from_its_head(self, limited: bool) -> None:
        """SQLite: the claim, and the pick of a claim under limits (here with a full
        handler), search each queue's line in the line index, never the table."""
        now = connection.ops.adapt_datetimefield_value(timezone.now())
        params = {"worker_id": "w1", "lease_expires_at": now, "now": now, "limit": 10}
        if limited:
            statement = sql_limits.candidates(queues=0, one_job=False, full_handlers=1)
            params["fh_0"] = "reports.generate"
        else:
            statement = sql.claim(connection.vendor, queues=0, one_job=False)
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {statement}", params)
            plan = [row[-1] for row in cursor.fetchall()]
        assert "SEARCH jobs_job USING INDEX jobs_job_line_idx (queue=?)" in plan, plan
        assert not [step for step in plan if re.fullmatch(r"SCAN (jobs_job|h)", step)], plan
