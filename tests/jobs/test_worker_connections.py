"""A database server that restarts (or a failover, or an idle timeout) closes every
connection a worker's handler threads hold. The next handler on such a thread must
open a new one rather than fail on the old: a restart must not cost a job an attempt,
nor delay it by a retry's back-off."""

from __future__ import annotations

import pytest
from django.db import OperationalError, connection, connections, transaction

from jobs import JobStatus, JobSubmission, submit_job
from jobs.models import Job
from jobs.worker import Worker
from ledon.db import drop_closed_connections

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

SCOPE = "connections"


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def terminate(pids: list[int]) -> None:
    """End the server processes ``pids`` and wait until they are gone (as a restart
    would), from a connection of its own."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [pids])
            gone = False
            while not gone:
                cursor.execute(
                    "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = ANY(%s)", [pids]
                )
                gone = cursor.fetchone()[0]
    finally:
        other.close()


def others_of_this_database(keep: list[int]) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(array_agg(pid), '{}') FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> ALL(%s)",
            [keep],
        )
        return list(cursor.fetchone()[0])


@pytest.mark.parametrize("concurrency", [2, 8])
def test_jobs_after_a_server_restart_run_on_new_connections(handler, concurrency):
    test_pid = backend_pid()

    @handler("connections.use")
    def use(ctx):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    @handler("connections.restart")
    def restart(ctx):
        # Once the warm-up jobs are done (each handler thread holds a connection),
        # end every connection of the database but the test's: what a restart does
        # to the worker's threads while they wait for work.
        done = False
        while not done:
            done = (
                not Job.objects.filter(job_id__startswith="warm-")
                .exclude(status=JobStatus.SUCCEEDED)
                .exists()
            )
        terminate(others_of_this_database(keep=[test_pid, backend_pid()]))
        connection.close()  # this thread's own, last: it just ended the others
        for n in range(12):
            submit_job(SCOPE, f"after-{n}", JobSubmission.create("connections.use"))

    for n in range(12):
        submit_job(SCOPE, f"warm-{n}", JobSubmission.create("connections.use", priority=5))
    submit_job(SCOPE, "restart", JobSubmission.create("connections.restart"))
    Worker(burst=True, listen=False, concurrency=concurrency).run()

    after = Job.objects.filter(job_id__startswith="after-")
    assert after.count() == 12
    # Each had one attempt (max_attempts=1): a stale connection would have failed it.
    failed = {j.job_id: j.error.splitlines()[-1:] for j in after if j.status != JobStatus.SUCCEEDED}
    assert failed == {}


def test_a_connection_the_server_closed_is_dropped_and_the_next_statement_reconnects():
    old = backend_pid()
    terminate([old])
    drop_closed_connections()
    assert connection.connection is None
    assert backend_pid() != old


def test_a_connection_that_saw_an_error_is_kept_if_it_answers():
    pid = backend_pid()
    connection.errors_occurred = True
    drop_closed_connections()
    assert connection.errors_occurred is False
    assert backend_pid() == pid


def test_a_connection_in_an_atomic_block_is_left_to_it():
    kept: list[bool] = []

    def block() -> None:
        with transaction.atomic():
            terminate([backend_pid()])
            drop_closed_connections()
            kept.append(connection.connection is not None)

    # The block owns its connection: the block's own commit is what fails.
    with pytest.raises(OperationalError):
        block()
    assert kept == [True]
    connection.close()


def test_a_thread_forgets_the_connections_it_no_longer_holds():
    """The wrappers a thread opened are remembered weakly: a thread that serves many
    contexts (ASGI) does not keep every wrapper it ever opened alive."""
    import gc

    from ledon import db as ledon_db

    backend_pid()  # the test's own connection, remembered
    for _ in range(5):
        other = connections.create_connection("default")
        other.ensure_connection()
        other.close()
        del other
    gc.collect()
    assert list(ledon_db._opened.wrappers) == [connections["default"]]
