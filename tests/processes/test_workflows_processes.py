"""Workflows driven by real ``run_jobs`` processes: a fan-in shared by several
workers resumes its run exactly once, a worker killed (SIGKILL) at each commit
boundary of the engine loses nothing and repeats no recorded checkpoint, and a
checkpoint whose commit reply is lost (PostgreSQL, behind the fault proxy) is
recorded once."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobs.models import Job
from testproject.workflow_checks.models import Effect
from tests.conftest import is_postgres
from tests.support.brokers import Processes
from tests.support.cluster import Cluster
from tests.support.procs import ManageProcess, WorkerProcess, manage, wait_until
from tests.support.proxy import FaultProxy
from workflows import RunStatus, WorkflowScope, send_signal, start_workflow
from workflows.models import WorkflowItem, WorkflowRun
from workflows.store import ADVANCE_HANDLER
from workflows.testing import run_workflows_inline

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCOPE = "tenant-procs"
#: Leases far longer than the test: only the restarted worker's recovery of its own
#: attempts can take the killed work back.
CRASH = {
    "JOBS_LEASE_SECONDS": "60",
    "JOBS_HEARTBEAT_SECONDS": "5",
    "JOBS_POLL_INTERVAL": "0.1",
    "JOBS_SCHEDULER": "0",
}


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        proc = WorkerProcess(tmp_path, *args, env={**CRASH, **(env or {})})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def advance_jobs(run_id: str) -> list[str]:
    pk = WorkflowRun.objects.get(run_id=run_id).pk
    jobs = Job.objects.filter(handler=ADVANCE_HANDLER, job_id__startswith=f"wf:{pk}.")
    return sorted(job_id.split(":")[2] for job_id in jobs.values_list("job_id", flat=True))


def effects(run_id: str, kind: str = "step") -> Counter[str]:
    return Counter(Effect.objects.filter(run_id=run_id, kind=kind).values_list("key", flat=True))


def test_a_map_shared_by_three_workers_resumes_its_run_exactly_once(workers, tmp_path):
    items = list(range(300))
    start_workflow(SCOPE, "fan-1", "checks.fanout", {"items": items})
    run_workflows_inline(max_attempts_run=1)  # the first advance: 300 item jobs
    # Each worker's one handler thread waits at the barrier with its first item until
    # all three have one: no worker can take every item before the others start, and
    # all three record items side by side.
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    fault = {"WORKFLOWS_FAULT": f"workflows.item.before_record@1:barrier:{barrier}:3"}
    procs = [workers("--burst", "--concurrency", "1", env=fault) for _ in range(3)]
    for proc in procs:
        assert proc.wait(timeout=300) == 0, proc.output
    snap = WorkflowScope(SCOPE).get("fan-1")
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert snap.output["doubled"] == [2 * n for n in items]
    assert snap.output["total"] == sum(2 * n for n in items)
    # Started once, woken once by the last item: two advance jobs, one "total".
    assert advance_jobs("fan-1") == ["items", "start"]
    assert effects("fan-1") == {"total": 1}
    assert effects("fan-1", "activity") == {str(n): 1 for n in items}
    ran_by = set(Effect.objects.filter(kind="activity").values_list("pid", flat=True))
    assert ran_by == {proc.pid for proc in procs}


def test_a_large_map_on_sqlite_ends_without_database_is_locked(workers):
    """SQLite has one writer at a time: 2,000 items queued with their checkpoint in
    one transaction, then run by three workers of four threads, each item's job
    claimed and finished beside the others' and writing a row of its own. No
    statement gives up on the lock: every item ends on its first try, the run
    succeeds, and no worker says "database is locked"."""
    if is_postgres():
        pytest.skip("SQLite only")
    items = list(range(2000))
    start_workflow(SCOPE, "big-map", "checks.fanout", {"items": items})
    procs = [workers("--burst", "--concurrency", "4") for _ in range(3)]
    for proc in procs:
        assert proc.wait(timeout=900) == 0, proc.output
    snap = WorkflowScope(SCOPE).get("big-map")
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert snap.output["doubled"] == [2 * n for n in items]
    jobs = Job.objects.filter(handler="checks.double")
    assert set(jobs.values_list("status", "attempt_count")) == {("succeeded", 1)}
    assert effects("big-map", "activity") == {str(n): 1 for n in items}
    for proc in procs:
        assert "database is locked" not in proc.output, proc.output


def kill_then_restart(workers, fault: str, *, burst_victim: bool = True) -> WorkerProcess:
    args = ["--worker-id", "victim", "--concurrency", "1"]
    victim = workers(*args, *(["--burst"] if burst_victim else []), env={"WORKFLOWS_FAULT": fault})
    assert victim.wait(timeout=120) == -signal.SIGKILL, victim.output
    again = workers(*args, "--burst")
    assert again.wait(timeout=120) == 0, again.output
    return again


@pytest.mark.parametrize(
    "point", ["workflows.step.before_checkpoint", "workflows.step.after_checkpoint"]
)
def test_sigkill_around_an_inline_checkpoint_runs_no_recorded_step_again(workers, point):
    start_workflow(SCOPE, "kill-step", "checks.linear", {"start": 4})
    kill_then_restart(workers, f"{point}@1:kill")
    snap = WorkflowScope(SCOPE).get("kill-step")
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert snap.output == {"a": 4, "b": 5}
    # Killed before the commit, "a" rolled back with its checkpoint; after it, "a" was
    # recorded: either way its write happened exactly once.
    assert effects("kill-step") == {"a": 1, "b": 1}


@pytest.mark.parametrize(
    ("fault", "ran_again"),
    [
        # An activity's work done, its result not yet in its job's finish: its job
        # runs again (activities run at least once).
        ("workflows.item.before_record@1:kill", 1),
        ("workflows.item.before_record@7:kill", 1),
        # One handler thread: the 20th item is the last, whose job's finish queues
        # the run's advance.
        ("workflows.item.before_record@20:kill", 1),
        # Every item recorded by its job, the fan-in not yet written: the run's
        # advance runs again (no activity runs again) and fans in once.
        ("workflows.map.fan_in@1:kill", 0),
    ],
)
def test_sigkill_in_the_fan_in_resumes_the_run_once(workers, fault, ran_again):
    items = list(range(20))
    start_workflow(SCOPE, "kill-fan", "checks.fanout", {"items": items})
    kill_then_restart(workers, fault)
    snap = WorkflowScope(SCOPE).get("kill-fan")
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert snap.output["total"] == sum(2 * n for n in items)
    assert advance_jobs("kill-fan") == ["items", "start"]
    assert effects("kill-fan") == {"total": 1}
    assert set(WorkflowItem.objects.values_list("status", flat=True)) == {"succeeded"}
    # The killed item's activity ran again if its job's finish had not committed
    # (activities run at least once); no other.
    ran = effects("kill-fan", "activity")
    assert set(ran) == {str(n) for n in items}
    assert sum(ran.values()) == len(items) + ran_again


def test_sigkill_as_a_timer_fires_fires_it_once(workers):
    start_workflow(SCOPE, "kill-nap", "checks.sleeper", {"seconds": 1})
    kill_then_restart(workers, "workflows.timer.wake@1:kill", burst_victim=False)
    snap = WorkflowScope(SCOPE).get("kill-nap")
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert effects("kill-nap") == {"before": 1, "after": 1}
    assert advance_jobs("kill-nap") == ["start", "timer"]


def test_sigkill_while_delivering_a_signal_delivers_it_once(workers, tmp_path):
    start_workflow(SCOPE, "kill-sig", "checks.signals", {})
    first = workers("--burst")
    assert first.wait(timeout=120) == 0, first.output
    code = (
        "from workflows import send_signal; "
        f"print(send_signal({SCOPE!r}, 'kill-sig', 'approved', {{'by': 'ops'}}))"
    )
    sender = ManageProcess(
        tmp_path, "shell", "-c", code, env={"WORKFLOWS_FAULT": "workflows.signal.deliver@1:kill"}
    )
    try:
        assert sender.wait(timeout=120) == -signal.SIGKILL, sender.output
    finally:
        sender.close()
    # Killed before its commit: not delivered; sent again, it is delivered once.
    assert not WorkflowRun.objects.get(run_id="kill-sig").signals.exists()
    assert send_signal(SCOPE, "kill-sig", "approved", {"by": "ops"}) == "delivered"
    assert send_signal(SCOPE, "kill-sig", "approved", {"by": "ops"}) == "already_sent"
    again = workers("--burst")
    assert again.wait(timeout=120) == 0, again.output
    snap = WorkflowScope(SCOPE).get("kill-sig")
    assert snap.output == {"by": "ops"}
    assert effects("kill-sig") == {"after": 1}
    assert advance_jobs("kill-sig") == ["signal", "start"]


def test_a_running_activity_sees_its_run_cancelled_through_its_job_context(workers):
    start_workflow(SCOPE, "cancel-act", "checks.cancellable")
    worker = workers()
    wait_until(
        lambda: effects("cancel-act", "activity")["started"], 60, "the activity to start", worker
    )
    assert WorkflowScope(SCOPE).cancel("cancel-act") == "cancelled"
    wait_until(
        lambda: effects("cancel-act", "activity")["saw-cancel"],
        60,
        "the activity to see the cancellation",
        worker,
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    snap = WorkflowScope(SCOPE).get("cancel-act")
    assert snap.status == RunStatus.CANCELLED
    assert snap.step("wait").status == "cancelled"
    assert list(
        Job.objects.filter(handler="checks.until_cancelled").values_list("status", flat=True)
    ) == ["cancelled"]


def test_an_item_whose_job_kills_every_worker_ends_and_its_run_fails(workers):
    """Every try of the activity kills its worker. Recovery gives the job back while
    the crash budget allows it, then ends it Interrupted, which no attempt_finished
    reports: the recovering process's word that the job keeps killing its worker
    ends the item (or, were it lost, a worker's upkeep pass), and the run fails
    instead of waiting for ever."""
    start_workflow(SCOPE, "dies", "checks.dies")
    for _ in range(10):
        worker = workers("--burst", "--worker-id", "victim", "--concurrency", "1")
        assert worker.wait(timeout=120) in (0, -signal.SIGKILL), worker.output
        if WorkflowScope(SCOPE).get("dies").finished:
            break
    snap = WorkflowScope(SCOPE).get("dies")
    assert snap.status == RunStatus.FAILED, snap.waiting_for
    assert snap.failed_step == "die"
    assert "ActivityJobEnded: its job ended Interrupted without recording it" in snap.error
    (job,) = Job.objects.filter(handler="checks.kills_its_worker")
    assert job.status == "interrupted"
    # Every try was counted on the item, and each killed its worker.
    (item,) = WorkflowItem.objects.filter(step__run__run_id="dies")
    assert effects("dies", "activity")["dying"] == item.attempts >= 1


def test_a_run_whose_inline_step_kills_every_worker_fails(workers):
    """Every try of an inline step kills its worker (SIGKILL). The worker restarted
    under the same id recovers its advance job and runs it again while the crash
    budget allows it; the interruption that reaches it ends the job for good, and
    the run ends Failed, saying why, instead of being handed to a new advance job
    that would kill its worker again, for ever."""
    start_workflow(SCOPE, "dies-inline", "checks.dies_inline")
    outputs = []
    for _ in range(8):
        worker = workers("--burst", "--worker-id", "victim", "--concurrency", "1")
        assert worker.wait(timeout=120) in (0, -signal.SIGKILL), worker.output
        outputs.append(worker.output)
        if WorkflowScope(SCOPE).get("dies-inline").finished:
            break
    snap = WorkflowScope(SCOPE).get("dies-inline")
    assert snap.status == RunStatus.FAILED, snap.waiting_for
    assert snap.error.startswith("KeepsKillingWorker: the run's advance job"), snap.error
    assert "after its checkpoint 'before'" in snap.error
    # One advance job, killed three times (the default budget); none after it.
    (job,) = Job.objects.filter(handler=ADVANCE_HANDLER)
    assert (job.status, job.keeps_killing_worker, job.interruption_count) == (
        "interrupted",
        True,
        3,
    )
    assert len(outputs) == 4
    assert "workflow checks.dies_inline run dies-inline failed" in outputs[-1]
    assert effects("dies-inline") == {"before": 1}


def test_an_item_whose_job_ended_unheard_moves_its_run_on_at_once(workers, tmp_path):
    """An activity ignores its timeout: its worker fails the item's job
    (``JobTimedOut``), and is killed (SIGKILL) once that committed, before it tells
    the workflows (``attempt_finished``): the item's row is still Running and no
    receiver will end it. The run goes on at once all the same, on another worker
    already running (its upkeep's pass at start-up done, the next 300 s away): the
    statement that ended the job queued its map's ``then`` job, and the fan-in reads
    the item as its job ended."""
    started = tmp_path / "hanging"
    start_workflow(SCOPE, "unheard", "checks.hang", {"marker": str(started)})
    survivor = workers("--queue", "default")
    item_jobs = Job.objects.filter(handler="checks.hangs")
    wait_until(item_jobs.exists, 60, "the first advance to queue the item's job", survivor)
    victim = workers(
        "--queue",
        "checks-hang",
        env={"WORKFLOWS_FAULT": "jobs.worker.finished@1:kill", "JOBS_TIMEOUT_GRACE_SECONDS": "0.5"},
    )
    assert victim.wait(timeout=120) == -signal.SIGKILL, victim.output
    assert started.exists()
    wait_until(
        lambda: WorkflowScope(SCOPE).get("unheard").finished, 60, "the run to go on", survivor
    )
    survivor.signal(signal.SIGTERM)
    assert survivor.wait() == 0, survivor.output
    (job,) = item_jobs
    assert job.status == "failed"
    assert "JobTimedOut" in job.error
    snap = WorkflowScope(SCOPE).get("unheard")
    assert snap.status == RunStatus.SUCCEEDED, snap.error
    assert snap.output == "ActivityJobEnded"
    assert effects("unheard") == {"after": 1}
    (item,) = WorkflowItem.objects.filter(step__run__run_id="unheard")
    assert (item.status, item.error_type) == ("failed", "ActivityJobEnded")
    # Not the upkeep's doing: its pass would have said so.
    assert "ended whose job had ended" not in survivor.output
    waited = (snap.finished_at - job.finished_at).total_seconds()
    print(f"from the item job's end to the run's end: {waited:.3f} s")


#: A worker behind the fault proxy: statements not prepared, so that each one's text
#: crosses the proxy where it is recognised; short leases and recovery.
AMBIGUOUS = {
    "JOBS_LEASE_SECONDS": "4",
    "JOBS_HEARTBEAT_SECONDS": "1",
    "JOBS_RECOVERY_INTERVAL": "1",
    "JOBS_SCHEDULER": "false",
    "JOBS_PREPARED_STATEMENTS": "false",
    "SAGAS_RECOVER_IN_WORKER": "false",
    "LEDON_ROUND_TRIP_DEADLINE": "2",
}


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    server = Cluster()
    manage(server.url, "migrate", "-v", "0", env=AMBIGUOUS)
    yield server
    server.stop()


@pytest.mark.postgres_only
@pytest.mark.timeout(300)
def test_an_inline_checkpoint_whose_commit_reply_is_lost_is_recorded_once(cluster, tmp_path):
    """The server commits an inline step's writes with its checkpoint, and the reply
    never reaches the worker: it cannot tell whether they happened. The advance job
    is tried again, the replay finds the checkpoint recorded, and the run finishes
    with each step's writes and checkpoint recorded once."""
    manage(
        cluster.url, "shell", "-c",
        "from workflows import start_workflow\n"
        f"start_workflow({SCOPE!r}, 'amb-1', 'checks.linear', {{'start': 3}})\n",
        env=AMBIGUOUS,
    )  # fmt: skip
    procs = Processes(tmp_path)
    with FaultProxy(cluster.port) as proxy:
        # The COMMIT of the transaction that recorded the first inline checkpoint.
        proxy.drop_reply(b"COMMIT", after=b'INSERT INTO "workflows_workflowstep"')
        try:
            worker = procs.start(
                "run_jobs", "--worker-id", "w-amb", "--concurrency", "1",
                env=AMBIGUOUS, database_url=proxy.url(cluster.url),
            )  # fmt: skip
            worker.wait_until(proxy.reply_dropped.is_set, "the checkpoint's commit reply to drop")
            status = "SELECT status FROM workflows_workflowrun WHERE run_id = 'amb-1'"
            wait_until(lambda: cluster.value(status) == "succeeded", 120, "the run to end", worker)
            assert worker.terminate() == 0, worker.output
        finally:
            procs.close()
        assert proxy.stats.replies_dropped == 1
    effects = "SELECT key, count(*) FROM workflow_checks_effect WHERE run_id = 'amb-1' GROUP BY key"
    assert dict(cluster.rows(effects)) == {"a": 1, "b": 1}
    steps = (
        "SELECT s.key, s.status, s.result_json FROM workflows_workflowstep s"
        " JOIN workflows_workflowrun r ON r.id = s.run_id WHERE r.run_id = 'amb-1' ORDER BY s.id"
    )
    assert cluster.rows(steps) == [("a", "succeeded", "3"), ("b", "succeeded", "4")]


@pytest.mark.postgres_only
def test_a_signal_wakes_its_waiting_run_while_the_workers_poll_is_far_off(workers):
    """A signal sent to a waiting run makes an idle worker go on with it although the
    worker's poll, heartbeat and recovery intervals are all far past the test's bound
    (the advance the signal queues is announced at its commit)."""
    start_workflow(SCOPE, "notify-1", "checks.signals", {})
    # An idle worker sleeps until the first of its poll, heartbeat and recovery
    # intervals, all far past the test's bound here, or until a NOTIFY wakes it.
    quiet = {
        "JOBS_POLL_INTERVAL": "600",
        "JOBS_RECOVERY_INTERVAL": "600",
        "JOBS_LEASE_SECONDS": "1800",
        "JOBS_HEARTBEAT_SECONDS": "600",
        "JOBS_SCHEDULER": "false",
    }
    worker = workers(env=quiet)
    wait_until(
        lambda: WorkflowScope(SCOPE).get("notify-1").waiting_for == "signal approved",
        60,
        "the run to wait for its signal",
        worker,
    )
    assert send_signal(SCOPE, "notify-1", "approved", {"by": "ops"}) == "delivered"
    wait_until(
        lambda: WorkflowScope(SCOPE).get("notify-1").status == RunStatus.SUCCEEDED,
        60,
        "the signalled run to finish",
        worker,
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output
    assert effects("notify-1") == {"after": 1}
