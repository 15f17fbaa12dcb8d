"""Ambiguous commits, with real processes (PostgreSQL): the server commits, the reply
never reaches the client (``FaultProxy.drop_reply`` resets the connection after
forwarding the commit). The client sees an error and cannot tell whether its write
happened; each write path must converge anyway:

- ``submit_job`` retried by its caller returns the same job, and one job exists;
- a worker's settle (finish-and-claim), heartbeat and progress report: every job ends
  with exactly one succeeded attempt and one effect;
- the dispatcher's "marked sent" and billing's inbox record: every order is billed
  once (one invoice, one fresh delivery), every message ends Sent;
- a saga step: recorded once, nothing compensated;
- a workflow checkpoint (the transaction that records an inline step with its writes,
  a map's or an activity's with its items, a timer, a child with its run, or the one
  that ends a map, an activity, a timer or a child): the advance fails, its job runs
  again, and its replay finds the checkpoint recorded. Every run succeeds, every
  checkpoint exists once under its (run, step) key, every inline step's writes
  happened once, every activity item's job has one succeeded attempt, every parent
  has one child;
- ``start_workflow`` retried by its caller returns the same run, with one first advance;
- ``send_signal`` retried by its caller: the retry says ``already_sent``, and the run
  reads one signal and goes on once;
- a run's cancel or resume retried by its caller: the cancel answers
  ``already_finished``, the resume ``InvalidTransition`` (the run no longer Failed),
  and the run was cancelled, or resumed, once.

Statements are not prepared (``JOBS_PREPARED_STATEMENTS=false``) so that each one's
text crosses the proxy every time, where the proxy recognises it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.brokers import ManageCommand, Processes
from tests.support.cluster import Cluster
from tests.support.procs import manage, wait_until
from tests.support.proxy import FaultProxy

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.timeout(600)]

ENV = {
    "JOBS_LEASE_SECONDS": "4",
    "JOBS_HEARTBEAT_SECONDS": "1",
    "JOBS_RECOVERY_INTERVAL": "1",
    "JOBS_SCHEDULER": "false",
    "JOBS_PREPARED_STATEMENTS": "false",
    "OUTBOX_LEASE_SECONDS": "4",
    "OUTBOX_RECOVERY_INTERVAL": "1",
    "OUTBOX_RETRY_BASE_DELAY": "0.2",
    "OUTBOX_BATCH_SIZE": "5",
    "SAGAS_RECOVER_IN_WORKER": "false",
    "LEDON_ROUND_TRIP_DEADLINE": "2",
    "SHOP_INVOICE_PAGE_SECONDS": "0.4",
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    server = Cluster()
    manage(server.url, "migrate", "-v", "0", env=ENV)
    yield server
    server.stop()


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[FaultProxy]:
    with FaultProxy(cluster.port) as started:
        yield started


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    yield started
    started.close()


def shell(procs: Processes, url: str, code: str) -> ManageCommand:
    return procs.start("shell", "-c", code, env=ENV, database_url=url)


def count(cluster: Cluster, sql: str) -> int:
    return int(cluster.value(sql))


SUBMIT_TWICE = """
from django.db import DatabaseError, InterfaceError, close_old_connections
from jobs import JobSubmission
from jobs.api import submit_job

sub = JobSubmission.create("test.outage", {"seconds": 0})
try:
    job = submit_job("ambiguous", "submit-1", sub)
    print("first: created" if job.created else "first: existing", flush=True)
except (DatabaseError, InterfaceError) as exc:
    print("first: error", type(exc).__name__, flush=True)
    close_old_connections()  # the documented retry: a fresh connection, the same call
    job = submit_job("ambiguous", "submit-1", sub)
    print("retry: created" if job.created else "retry: existing", flush=True)
"""


def test_a_submission_whose_reply_is_lost_is_retried_into_the_same_job(cluster, proxy, procs):
    proxy.drop_reply(b"ON CONFLICT (scope_hash, job_id) DO NOTHING")
    proc = shell(procs, proxy.url(cluster.url), SUBMIT_TWICE)
    assert proc.wait(60) == 0, proc.output
    assert proxy.stats.replies_dropped == 1
    assert "first: error OperationalError" in proc.output
    assert "retry: existing" in proc.output  # the lost commit happened
    assert count(cluster, "SELECT count(*) FROM jobs_job WHERE job_id = 'submit-1'") == 1


SEED_JOBS = """
from jobs import JobSubmission, submit_jobs
submit_jobs(
    [("ambiguous", f"settle-{n}", JobSubmission.create("test.outage", {"seconds": 0.05},
                                                       max_attempts=20))
     for n in range(40)]
    + [("ambiguous", f"invoice-{n}", JobSubmission.create("shop.invoice", {"order": f"A-{n}"},
                                                          max_attempts=20))
       for n in range(4)]
)
"""

#: (what, the pattern whose reply is dropped, the write before it on the connection)
WORKER_WRITES = [
    ("heartbeat", b"RETURNING current_token AS token, cancel_requested", None),
    ("progress report", b"COMMIT", b"progress_message"),
    ("settle (finish and claim)", b"orphan", None),
]


def test_a_worker_whose_settle_heartbeat_or_progress_reply_is_lost_converges(cluster, proxy, procs):
    manage(cluster.url, "shell", "-c", SEED_JOBS, env=ENV)
    worker = procs.start(
        "run_jobs", "--worker-id", "w-ambiguous", "--concurrency", "4", env=ENV,
        database_url=proxy.url(cluster.url),
    )  # fmt: skip
    dropped = []
    for what, pattern, after in WORKER_WRITES:
        proxy.drop_reply(pattern, after=after)
        worker.wait_until(proxy.reply_dropped.is_set, f"the reply to a {what} to be dropped")
        dropped.append(what)
    # Only the jobs seeded here: the scope may hold another test's jobs (this module's
    # cluster is shared), which this worker runs too, so a count of the whole scope
    # could pass 44 in one settle and never equal it.
    done = (
        "SELECT count(*) FROM jobs_job WHERE (job_id LIKE 'settle-%' OR job_id LIKE"
        " 'invoice-%') AND status = 'succeeded'"
    )
    wait_until(lambda: count(cluster, done) == 44, 120, "every job to succeed", worker)
    assert worker.proc.poll() is None, worker.output
    assert not count(
        cluster,
        "SELECT count(*) FROM (SELECT job_id FROM jobs_jobattempt WHERE status = 'succeeded'"
        " GROUP BY job_id HAVING count(*) > 1) twice",
    )
    assert (
        count(
            cluster,
            "SELECT count(*) FROM jobs_job j JOIN jobs_jobattempt a ON a.job_id = j.id"
            " AND a.status = 'succeeded' JOIN shop_worklog w ON w.token = a.token"
            " WHERE j.job_id LIKE 'settle-%'",
        )
        == 40
    )
    assert count(cluster, "SELECT count(*) FROM shop_worklog WHERE job_id LIKE 'settle-%'") >= 40
    assert worker.terminate() == 0
    print(f"\nreplies dropped: {dropped}; {worker.output.strip().splitlines()[-1]}")


def test_a_dispatcher_whose_inbox_or_sent_reply_is_lost_delivers_each_order_once(
    cluster, proxy, procs
):
    dispatcher = procs.start(
        "dispatch_outbox", "--dispatcher-id", "d-ambiguous", env=ENV,
        database_url=proxy.url(cluster.url),
    )  # fmt: skip
    dispatcher.wait_for_output("started ")
    proxy.drop_reply(b"COMMIT", after=b"(consumer, message_id, processed_at)")
    manage(
        cluster.url, "shell", "-c",
        "from decimal import Decimal\n"
        "from testproject.orders.services import place_order\n"
        "for n in range(20): place_order(f'AMB-{n:03}', Decimal('5.00'))\n",
        env=ENV,
    )  # fmt: skip
    dispatcher.wait_until(proxy.reply_dropped.is_set, "the reply to an inbox commit to drop")
    proxy.drop_reply(b"COMMIT", after=b"sent_at = ")
    manage(
        cluster.url, "shell", "-c",
        "from decimal import Decimal\n"
        "from testproject.orders.services import place_order\n"
        "for n in range(20, 40): place_order(f'AMB-{n:03}', Decimal('5.00'))\n",
        env=ENV,
    )  # fmt: skip
    dispatcher.wait_until(proxy.reply_dropped.is_set, "the reply to a 'sent' commit to drop")
    orders = "SELECT count(*) FROM orders_order WHERE number LIKE 'AMB-%'"
    invoices = "SELECT count(*) FROM orders_invoice WHERE order_number LIKE 'AMB-%'"
    unsent = (
        "SELECT count(*) FROM outbox_outboxmessage WHERE event_type = 'orders.placed'"
        " AND status <> 'sent'"
    )
    wait_until(
        lambda: count(cluster, invoices) == 40 and not count(cluster, unsent),
        120, "every order billed and every message sent", dispatcher,
    )  # fmt: skip
    assert count(cluster, orders) == 40
    assert count(
        cluster, "SELECT count(DISTINCT order_number) FROM orders_invoice"
        " WHERE order_number LIKE 'AMB-%'",
    ) == 40  # fmt: skip
    # Each message reached billing fresh once; a second delivery, if any, found the
    # inbox record and did nothing.
    assert not count(
        cluster,
        "SELECT count(*) FROM (SELECT message_id FROM orders_delivery WHERE fresh"
        " GROUP BY message_id HAVING count(*) > 1) twice",
    )
    redelivered = count(cluster, "SELECT count(*) FROM orders_delivery WHERE NOT fresh")
    print(f"\ndeliveries that found their inbox record: {redelivered}")
    assert proxy.stats.replies_dropped == 2
    assert dispatcher.terminate() == 0


START_SAGAS = """
from sagas import start_saga
for n in range(6):
    start_saga("fulfilment.order", {"order_id": 9000 + n, "sku": "SKU", "quantity": 1,
                                    "amount": "9.90"})
"""


def test_a_saga_step_whose_commit_reply_is_lost_is_recorded_once(cluster, proxy, procs):
    proxy.drop_reply(b"COMMIT", after=b'"completed_steps"')
    manage(cluster.url, "shell", "-c", START_SAGAS, env=ENV)
    runner = procs.start(
        "recover_sagas", "--runner-id", "r-ambiguous",
        env={**ENV, "SAGAS_LEASE_SECONDS": "3", "SAGAS_POLL_INTERVAL": "0.2"},
        database_url=proxy.url(cluster.url),
    )  # fmt: skip
    runner.wait_until(proxy.reply_dropped.is_set, "the reply to a step's commit to drop")
    done = (
        "SELECT count(*) FROM sagas_sagainstance WHERE status = 'succeeded'"
        " AND data->>'order_id' LIKE '900%'"
    )
    wait_until(lambda: count(cluster, done) == 6, 120, "every saga to succeed", runner)
    # Every step of every instance ran its action once, and nothing was compensated.
    assert not count(
        cluster,
        "SELECT count(*) FROM (SELECT instance_id, step FROM fulfilment_steprun"
        " WHERE kind = 'action' GROUP BY instance_id, step HAVING count(*) > 1) twice",
    )
    assert not count(
        cluster,
        "SELECT count(*) FROM sagas_sagainstance WHERE compensated_steps <> '[]'"
        " AND data->>'order_id' LIKE '900%'",
    )
    assert runner.terminate() == 0


#: The COMMITs whose replies are dropped: those of the transactions that record a
#: checkpoint (an inline step's with its writes, a map's or an activity's with its
#: items and their jobs, a timer's, a child's with the child run) and of those that
#: end one (a map's or an activity's fan-in, a timer that fires, a child that ended).
RECORD = b'INSERT INTO "workflows_workflowstep"'
END = b'UPDATE "workflows_workflowstep"'
#: A child run is created in its parent's checkpoint transaction.
CHILD = b'INSERT INTO "workflows_workflowrun"'


def run_through_lost_replies(
    cluster: Cluster,
    proxy: FaultProxy,
    procs: Processes,
    start: str,
    drops: list[tuple[bytes, int]],
    checkpoints: dict[str, set[tuple[str, str]]],
) -> int:
    """Start the runs (``start``), arm ``drops`` ((what goes before the COMMIT, how
    many times)), and let a worker behind the proxy drive every run to its end; then
    check what any checkpoint's lost reply must leave: every run of ``checkpoints``
    (run id -> its (key, kind) pairs) succeeded and none held or stuck, every
    checkpoint recorded once, every inline step's writes made once. Returns how many
    advance attempts failed (and were tried again)."""
    manage(cluster.url, "shell", "-c", start, env=ENV)
    for after, times in drops:
        proxy.drop_reply(b"COMMIT", after=after, times=times)
    dropped = sum(times for _, times in drops)
    worker = procs.start(
        "run_jobs", "--worker-id", "w-wf-ambiguous", "--concurrency", "2", env=ENV,
        database_url=proxy.url(cluster.url),
    )  # fmt: skip
    worker.wait_until(
        lambda: proxy.stats.replies_dropped == dropped, "every armed checkpoint reply to drop"
    )
    ours = "r.run_id = ANY(%s)"
    run_ids = [sorted(checkpoints)]
    succeeded = (
        f"SELECT count(*) FROM workflows_workflowrun r WHERE {ours} AND r.status = 'succeeded'"
    )
    # No advance or item job of these runs is left to run (none queued for a retry,
    # none running): nothing is stuck behind a run that looks finished.
    unfinished_jobs = (
        "SELECT count(*) FROM jobs_job j JOIN workflows_workflowrun r"
        " ON j.job_id LIKE 'wf:' || r.id || '.%%' OR j.job_id LIKE 'wf-item:' || r.id || '.%%'"
        f" WHERE {ours} AND j.status NOT IN ('succeeded', 'failed', 'cancelled')"
    )
    wait_until(
        lambda: cluster.value(succeeded, run_ids) == len(checkpoints)
        and not cluster.value(unfinished_jobs, run_ids),
        180, "every run to succeed and its jobs to end", worker,
    )  # fmt: skip
    assert worker.proc.poll() is None, worker.output
    assert not cluster.value(
        f"SELECT count(*) FROM workflows_workflowrun r WHERE {ours} AND (r.driver_token"
        " IS NOT NULL OR r.wake_pending OR r.cancel_requested)",
        run_ids,
    )

    # Every checkpoint exists once under its (run, step) key, succeeded.
    steps = cluster.rows(
        "SELECT r.run_id, s.key, s.kind, s.status, count(*) OVER (PARTITION BY s.run_id, s.key)"
        " FROM workflows_workflowstep s JOIN workflows_workflowrun r ON r.id = s.run_id"
        f" WHERE {ours}",
        run_ids,
    )
    recorded: dict[str, set[tuple[str, str]]] = {}
    for run_id, key, kind, status, copies in steps:
        assert (status, copies) == ("succeeded", 1), (run_id, key, status, copies)
        recorded.setdefault(run_id, set()).add((key, kind))
    assert recorded == checkpoints

    # Inline steps (kind "step"): their writes commit with their checkpoint, so each
    # happened exactly once although the worker could not tell whether the commit had.
    # (Each of these steps writes one effect row under its own key.)
    inline = cluster.rows(
        "SELECT run_id, key, count(*) FROM workflow_checks_effect"
        " WHERE kind = 'step' AND run_id = ANY(%s) GROUP BY run_id, key",
        run_ids,
    )
    assert {(run_id, key): copies for run_id, key, copies in inline} == {
        (run_id, key): 1
        for run_id, keys in checkpoints.items()
        for key, kind in keys
        if kind == "step"
    }

    # Each lost reply failed the advance that wrote it, whose job ran again.
    failed_advances = int(
        cluster.value(
            "SELECT count(*) FROM jobs_jobattempt a JOIN jobs_job j ON j.id = a.job_id"
            " JOIN workflows_workflowrun r ON j.job_id LIKE 'wf:' || r.id || '.%%'"
            f" WHERE {ours} AND a.status <> 'succeeded'",
            run_ids,
        )
    )
    assert proxy.stats.replies_dropped == dropped
    assert worker.terminate() == 0
    return failed_advances


START_STEPS = """
from workflows import start_workflow
for n in range(6):
    start_workflow("ambiguous", f"wfamb-linear-{n}", "checks.linear", {"start": n})
    start_workflow("ambiguous", f"wfamb-fanout-{n}", "checks.fanout", {"items": [1, 2, 3]})
    start_workflow("ambiguous", f"wfamb-activity-{n}", "checks.activity", {"value": n})
"""


def test_a_step_checkpoint_whose_commit_reply_is_lost_is_recorded_once(cluster, proxy, procs):
    """Inline steps ("checks.linear": two), a map of three activity items then an
    inline step ("checks.fanout"), one activity step ("checks.activity")."""
    checkpoints = {
        **{f"wfamb-linear-{n}": {("a", "step"), ("b", "step")} for n in range(6)},
        **{f"wfamb-fanout-{n}": {("double", "map"), ("total", "step")} for n in range(6)},
        **{f"wfamb-activity-{n}": {("double", "activity")} for n in range(6)},
    }
    drops = [(RECORD, 4), (END, 2)]
    failed = run_through_lost_replies(cluster, proxy, procs, START_STEPS, drops, checkpoints)
    outputs = dict(
        cluster.rows(
            "SELECT run_id, output_json FROM workflows_workflowrun WHERE run_id = ANY(%s)",
            [sorted(checkpoints)],
        )
    )
    for n in range(6):
        assert json.loads(outputs[f"wfamb-linear-{n}"]) == {"a": n, "b": n + 1}
        assert json.loads(outputs[f"wfamb-fanout-{n}"]) == {"doubled": [2, 4, 6], "total": 12}
        assert json.loads(outputs[f"wfamb-activity-{n}"]) == 2 * n
    # Activities run as jobs: every item ended succeeded, its job with one succeeded
    # attempt. (An activity's own effect is at least once by contract: each try is
    # counted on its item, and every try wrote one effect row.)
    items = (
        "FROM workflows_workflowitem i JOIN workflows_workflowstep s ON s.id = i.step_id"
        " JOIN workflows_workflowrun r ON r.id = s.run_id WHERE r.run_id LIKE 'wfamb-%'"
    )
    assert cluster.rows(f"SELECT i.status, count(*) {items} GROUP BY i.status") == [
        ("succeeded", 6 * 3 + 6)
    ]
    assert not count(
        cluster,
        "SELECT count(*) FROM jobs_job j WHERE j.job_id LIKE 'wf-item:%' AND (SELECT count(*)"
        " FROM jobs_jobattempt a WHERE a.job_id = j.id AND a.status = 'succeeded') <> 1",
    )
    activity_tries = count(
        cluster, "SELECT count(*) FROM workflow_checks_effect WHERE kind = 'activity'"
        " AND run_id LIKE 'wfamb-%'",
    )  # fmt: skip
    assert activity_tries == count(cluster, f"SELECT sum(i.attempts) {items}")
    assert failed >= 6
    print(
        f"\nstep checkpoint replies dropped: 6; advance attempts failed and tried again:"
        f" {failed}; activity tries: {activity_tries} for 24 items"
    )


START_WAITS = """
from workflows import start_workflow
for n in range(4):
    start_workflow("ambiguous", f"wfwait-timer-{n}", "checks.sleeper", {"seconds": 1})
    start_workflow("ambiguous", f"wfwait-parent-{n}", "checks.parent", {})
"""


def test_a_timer_or_child_checkpoint_whose_commit_reply_is_lost_is_recorded_once(
    cluster, proxy, procs
):
    """A timer between two inline steps ("checks.sleeper"), a child run of two inline
    steps ("checks.parent")."""
    checkpoints = {
        **{
            f"wfwait-timer-{n}": {("before", "step"), ("nap", "sleep"), ("after", "step")}
            for n in range(4)
        },
        **{f"wfwait-parent-{n}": {("kid", "child")} for n in range(4)},
        **{f"wfwait-parent-{n}/kid": {("a", "step"), ("b", "step")} for n in range(4)},
    }
    drops = [(CHILD, 2), (END, 3), (RECORD, 2)]
    failed = run_through_lost_replies(cluster, proxy, procs, START_WAITS, drops, checkpoints)
    outputs = dict(
        cluster.rows(
            "SELECT run_id, output_json FROM workflows_workflowrun WHERE run_id LIKE 'wfwait-%'"
        )
    )
    for n in range(4):
        assert json.loads(outputs[f"wfwait-timer-{n}"]) == "woke"
        assert json.loads(outputs[f"wfwait-parent-{n}"]) == {"child": {"a": 10, "b": 11}}
    # One child per parent, although a parent's checkpoint that created its child
    # may have lost its reply.
    assert count(cluster, "SELECT count(*) FROM workflows_workflowrun WHERE parent_id IS NOT NULL"
                 " AND run_id LIKE 'wfwait-%'") == 4  # fmt: skip
    assert failed >= 7
    print(f"\ntimer and child checkpoint replies dropped: 7; advance attempts failed: {failed}")


START_TWICE = """
from django.db import DatabaseError, InterfaceError, close_old_connections
from workflows import start_workflow

try:
    run = start_workflow("ambiguous", "wfstart-1", "checks.linear", {"start": 1})
    print("first: created" if run.created else "first: existing", flush=True)
except (DatabaseError, InterfaceError) as exc:
    print("first: error", type(exc).__name__, flush=True)
    close_old_connections()  # the documented retry: a fresh connection, the same call
    run = start_workflow("ambiguous", "wfstart-1", "checks.linear", {"start": 1})
    print("retry: created" if run.created else "retry: existing", flush=True)
"""


def test_a_workflow_start_whose_reply_is_lost_is_retried_into_the_same_run(cluster, proxy, procs):
    proxy.drop_reply(b"COMMIT", after=b'INSERT INTO "workflows_workflowrun"')
    proc = shell(procs, proxy.url(cluster.url), START_TWICE)
    assert proc.wait(60) == 0, proc.output
    assert proxy.stats.replies_dropped == 1
    assert "first: error OperationalError" in proc.output
    assert "retry: existing" in proc.output  # the lost commit happened
    run = "SELECT id FROM workflows_workflowrun WHERE run_id = 'wfstart-1'"
    assert cluster.rows(run) == [(cluster.value(run),)]
    # Its first advance was staged with it, once.
    assert count(
        cluster, f"SELECT count(*) FROM jobs_job WHERE job_id = 'wf:' || ({run}) || '.0:start'"
    ) == 1  # fmt: skip


#: Cancel or resume a run (filled in with ``.format(what=…, run_id=…)``).
STEER_TWICE = """
from django.db import DatabaseError, InterfaceError, close_old_connections
from workflows import WorkflowScope
from workflows.exceptions import InvalidTransition

what, run_id = {what!r}, {run_id!r}
runs = WorkflowScope("ambiguous")
call = runs.cancel if what == "cancel" else runs.resume
try:
    call(run_id)
    print("first: done", flush=True)
except (DatabaseError, InterfaceError) as exc:
    print("first: error", type(exc).__name__, flush=True)
    close_old_connections()  # the documented retry: a fresh connection, the same call
    try:
        outcome = call(run_id)
        print("retry:", getattr(outcome, "value", "resumed"), flush=True)
    except InvalidTransition:
        print("retry: InvalidTransition;", runs.get(run_id).status, flush=True)
"""


def test_a_cancel_or_resume_whose_reply_is_lost_is_read_back(cluster, proxy, procs):
    manage(
        cluster.url, "shell", "-c",
        "from workflows import start_workflow\n"
        "from workflows.testing import run_workflow\n"
        "start_workflow('ambiguous', 'wfcancel-1', 'checks.signals', {})\n"
        "start_workflow('ambiguous', 'wfresume-1', 'checks.flaky', {'fail_times': 1,"
        " 'retries': 0})\n"
        "assert run_workflow('ambiguous', 'wfresume-1').status == 'failed'\n",
        env=ENV,
    )  # fmt: skip
    url = proxy.url(cluster.url)
    for what, run_id in [("cancel", "wfcancel-1"), ("resume", "wfresume-1")]:
        proxy.drop_reply(b"COMMIT", after=b'UPDATE "workflows_workflowrun"')
        proc = shell(procs, url, STEER_TWICE.format(what=what, run_id=run_id))
        assert proc.wait(60) == 0, proc.output
        assert "first: error OperationalError" in proc.output, proc.output
    assert proxy.stats.replies_dropped == 2
    cancel_out, resume_out = (proc.output for proc in procs.started)
    # The lost cancel had ended the run: the retry finds it finished, changes nothing.
    assert "retry: already_finished" in cancel_out
    assert cluster.value(
        "SELECT status FROM workflows_workflowrun WHERE run_id = 'wfcancel-1'"
    ) == ("cancelled")
    # The lost resume had happened: the retry is refused (the run is no longer Failed),
    # and the run was resumed once: one new generation, one advance for it.
    assert "retry: InvalidTransition; waiting" in resume_out
    run = "FROM workflows_workflowrun WHERE run_id = 'wfresume-1'"
    assert cluster.rows(f"SELECT status, generation {run}") == [("waiting", 1)]
    assert count(
        cluster, f"SELECT count(*) FROM jobs_job WHERE job_id LIKE 'wf:' || (SELECT id {run})"
        " || '.1:%'",
    ) == 1  # fmt: skip


SIGNAL_TWICE = """
from django.db import DatabaseError, InterfaceError, close_old_connections
from workflows import send_signal

try:
    print("first:", send_signal("ambiguous", "wfamb-signal", "approved", {"by": "ops"}), flush=True)
except (DatabaseError, InterfaceError) as exc:
    print("first: error", type(exc).__name__, flush=True)
    close_old_connections()  # the documented retry: a fresh connection, the same call
    print("retry:", send_signal("ambiguous", "wfamb-signal", "approved", {"by": "ops"}), flush=True)
"""


def test_a_signal_whose_commit_reply_is_lost_is_sent_again_and_recorded_once(cluster, proxy, procs):
    manage(
        cluster.url, "shell", "-c",
        "from workflows import start_workflow\n"
        "start_workflow('ambiguous', 'wfamb-signal', 'checks.signals', {})\n",
        env=ENV,
    )  # fmt: skip
    worker = procs.start(
        "run_jobs", "--worker-id", "w-wf-signal", "--concurrency", "1", env=ENV,
        database_url=cluster.url,
    )  # fmt: skip
    run = "FROM workflows_workflowrun WHERE run_id = 'wfamb-signal'"
    worker.wait_until(
        lambda: cluster.rows(f"SELECT wait_kind, wait_key {run}") == [("signal", "approved")],
        "the run to wait for its signal",
    )
    proxy.drop_reply(b"COMMIT", after=b'INSERT INTO "workflows_workflowsignal"')
    sender = shell(procs, proxy.url(cluster.url), SIGNAL_TWICE)
    assert sender.wait(60) == 0, sender.output
    assert proxy.stats.replies_dropped == 1
    assert "first: error OperationalError" in sender.output
    # The lost commit happened: the retry finds the same signal, and changes nothing.
    assert "retry: already_sent" in sender.output
    worker.wait_until(
        lambda: cluster.value(f"SELECT status {run}") == "succeeded", "the signalled run to end"
    )
    assert json.loads(cluster.value(f"SELECT output_json {run}")) == {"by": "ops"}
    assert count(
        cluster, "SELECT count(*) FROM workflows_workflowsignal s JOIN workflows_workflowrun r"
        " ON r.id = s.run_id WHERE r.run_id = 'wfamb-signal'",
    ) == 1  # fmt: skip
    # Woken once by its signal (one advance job for it), its next step run once.
    wakes = cluster.rows(
        "SELECT split_part(job_id, ':', 3) FROM jobs_job WHERE job_id LIKE"
        f" 'wf:' || (SELECT id {run}) || '.%' ORDER BY 1"
    )
    assert wakes == [("signal",), ("start",)]
    assert (
        count(cluster, "SELECT count(*) FROM workflow_checks_effect WHERE run_id = 'wfamb-signal'")
        == 1
    )
    assert worker.terminate() == 0
