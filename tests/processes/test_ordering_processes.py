"""Batches and sequences with real ``run_jobs`` processes, on SQLite and PostgreSQL: a
batch's ``then`` runs exactly once though its workers are SIGKILLed mid-batch, and
however its last jobs' finishes race across workers; a sequence keeps strict order
across two workers and a retried failure, halts on a failure and goes on after a
retry or a cancel."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import testproject.ordering.tasks  # noqa: F401  (the then's handler, known here too)
from jobs import JobScope, JobStatus, JobSubmission, submit_batch, submit_job
from jobs.models import Job, JobAttempt, Sequence
from jobs.types import AttemptStatus, CancelOutcome
from tests.support.procs import WorkerProcess, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SCOPE = "ordering-processes"
FAST = {
    "ORDERING_TASKS": "1",
    "JOBS_POLL_INTERVAL": "0.05",
    "JOBS_SCHEDULER": "false",
    "JOBS_LEASE_SECONDS": "2",
    "JOBS_HEARTBEAT_SECONDS": "0.3",
    "JOBS_RECOVERY_INTERVAL": "0.3",
}


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        proc = WorkerProcess(tmp_path, *args, env={**FAST, **(env or {})})
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def row(n: int, **payload: object) -> JobSubmission:
    return JobSubmission.create("ordering.row", {"n": n, **payload}, max_attempts=3)


THEN = JobSubmission.create("ordering.done", {"import": 1})


def _then_ran_once(batch_id: str, total: int) -> None:
    then = Job.objects.get(job_id=f"{batch_id}:then")
    assert then.status == JobStatus.SUCCEEDED
    assert then.attempts.filter(status=AttemptStatus.SUCCEEDED).count() == 1
    assert Job.objects.filter(job_id__startswith=f"{batch_id}:").count() == 1
    seen = json.loads(then.result_ref or "{}")
    assert (seen["total"], seen["pending"], seen["status"]) == (total, 0, "done")
    batch = JobScope(SCOPE).batch(batch_id)
    assert batch is not None
    assert (batch.pending, batch.succeeded + batch.failed) == (0, total)


@pytest.mark.timeout(300)
def test_a_batch_whose_workers_are_killed_runs_then_once(
    workers: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    jobs = [(f"row-{n}", row(n, gate=str(gate))) for n in range(40)]
    submit_batch(SCOPE, "import-1", jobs, then=THEN)
    victims = [workers("--concurrency", "4") for _ in range(2)]

    def running() -> int:
        return Job.objects.filter(status=JobStatus.RUNNING, batch_id="import-1").count()

    # Both victims hold jobs of the batch in their handlers: kill them there.
    wait_until(lambda: running() == 8, 60, "8 jobs of the batch to run", victims[0])
    for victim in victims:
        victim.kill()
        assert victim.proc.returncode == -signal.SIGKILL
    gate.touch()
    # A worker killed right after its third round of finishes commits, then one that
    # recovers the killed attempts and drains the rest.
    killed = workers("--concurrency", "2", env={"JOBS_FAULT": "jobs.worker.settled@3:kill"})
    assert killed.wait(120) == -signal.SIGKILL, killed.output
    drainer = workers("--concurrency", "4")
    wait_until(
        lambda: Job.objects.filter(job_id="import-1:then", status=JobStatus.SUCCEEDED).exists(),
        120,
        "the batch's then to succeed",
        drainer,
    )
    assert not Job.objects.filter(batch_id="import-1").exclude(status=JobStatus.SUCCEEDED)
    assert JobAttempt.objects.filter(status=AttemptStatus.INTERRUPTED).count() >= 8
    _then_ran_once("import-1", 40)


@pytest.mark.timeout(300)
def test_then_runs_once_however_the_last_finishes_race(
    workers: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    procs = [workers("--concurrency", "2") for _ in range(3)]
    for round_ in range(3):
        gate = tmp_path / f"gate-{round_}"
        batch_id = f"race-{round_}"
        submit_batch(
            SCOPE,
            batch_id,
            [(f"{batch_id}-{n}", row(n, gate=str(gate))) for n in range(6)],
            then=THEN,
        )
        # Every job of the batch runs at once on the three workers, held at the gate;
        # opened, their finishes race to be the last.
        wait_until(
            lambda b=batch_id: (
                Job.objects.filter(status=JobStatus.RUNNING, batch_id=b).count() == 6
            ),
            60,
            "the whole batch to run at once",
            procs[0],
        )
        gate.touch()
        wait_until(
            lambda b=batch_id: Job.objects.filter(
                job_id=f"{b}:then", status=JobStatus.SUCCEEDED
            ).exists(),
            60,
            "the then to succeed",
            procs[0],
        )
        _then_ran_once(batch_id, 6)


def _attempt_spans(job_ids: list[str]) -> list[tuple[str, object, object]]:
    """Each attempt of ``job_ids`` as (job id, started, finished), by start."""
    return sorted(
        JobAttempt.objects.filter(job__job_id__in=job_ids).values_list(
            "job__job_id", "started_at", "finished_at"
        ),
        key=lambda span: span[1],
    )


@pytest.mark.timeout(300)
def test_a_sequence_keeps_strict_order_across_two_workers_and_a_retried_failure(
    workers: Callable[..., WorkerProcess], tmp_path: Path
) -> None:
    ids = [f"post-{n:02d}" for n in range(30)]
    log = tmp_path / "runs.log"
    for n, job_id in enumerate(ids):
        payload: dict[str, object] = {"log": str(log)}
        if n == 7:
            payload["fail_first"] = True
        submit_job(
            SCOPE,
            job_id,
            JobSubmission.create(
                "ordering.row", {"n": n, **payload}, max_attempts=2, sequence_key="acct-42"
            ),
        )
    # Other work beside it, which the sequence never blocks.
    for n in range(20):
        submit_job(SCOPE, f"free-{n}", row(n))
    procs = [workers("--concurrency", "4") for _ in range(2)]
    wait_until(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 50,
        120,
        "every job to succeed",
        procs[0],
    )
    # Every job ran once, the failed one twice. Their order is not read from the
    # attempts' start times: each worker takes its claim's time before it sends the
    # claim, so across two workers a stalled one can record a start before one that
    # came first.
    spans = _attempt_spans(ids)
    assert sorted(job_id for job_id, _s, _f in spans) == sorted([*ids, ids[7]])
    # One at a time, each started after the one before ended, as the two workers'
    # handlers noted it in one file (the order of its appends, not of two clocks).
    runs = sorted([*ids, ids[7]])
    expected = [line for job_id in runs for line in (f"start {job_id}", f"end {job_id}")]
    assert log.read_text().splitlines() == expected
    assert Sequence.objects.get(sequence_key="acct-42").open == 0


@pytest.mark.parametrize("resume", ["retry", "cancel"])
def test_a_halted_sequence_waits_for_an_operator(
    workers: Callable[..., WorkerProcess], resume: str
) -> None:
    ids = [f"step-{n}" for n in range(5)]
    for n, job_id in enumerate(ids):
        payload = {"n": n, "fail_first": n == 1}
        submit_job(
            SCOPE,
            job_id,
            JobSubmission.create("ordering.strict", payload, max_attempts=1, sequence_key="k"),
        )
    proc = workers("--concurrency", "2")
    wait_until(
        lambda: Job.objects.filter(job_id="step-1", status=JobStatus.FAILED).exists(),
        60,
        "the failure",
        proc,
    )
    # Work submitted after the failure runs, while the sequence stays halted.
    submit_job(SCOPE, "after", row(0))
    wait_until(
        lambda: Job.objects.filter(job_id="after", status=JobStatus.SUCCEEDED).exists(),
        60,
        "later work to run",
        proc,
    )
    halted = Sequence.objects.get(sequence_key="k")
    assert halted.halted_by == "step-1"
    assert (
        list(Job.objects.filter(job_id__in=ids[2:]).values_list("status", "sequence_held"))
        == [(JobStatus.QUEUED, True)] * 3
    )
    if resume == "retry":
        JobScope(SCOPE).retry("step-1", extra_attempts=1)
    else:
        assert JobScope(SCOPE).cancel("step-1") is CancelOutcome.CANCELLED
    wait_until(
        lambda: Job.objects.filter(job_id__in=ids[2:], status=JobStatus.SUCCEEDED).count() == 3,
        60,
        "the sequence to go on",
        proc,
    )
    step_1 = Job.objects.get(job_id="step-1")
    assert step_1.status == (JobStatus.SUCCEEDED if resume == "retry" else JobStatus.CANCELLED)
    spans = _attempt_spans(ids)
    expected = ["step-0", "step-1", "step-1", "step-2", "step-3", "step-4"]
    if resume == "cancel":
        expected.remove("step-1")
    assert [job_id for job_id, _s, _f in spans] == expected
    assert Sequence.objects.get(sequence_key="k").halted_by is None


@pytest.mark.parametrize("ending", ["succeeds", "fails"])
def test_a_burst_runs_the_then_its_own_last_finish_queued(
    workers: Callable[..., WorkerProcess], tmp_path: Path, ending: str
) -> None:
    """A burst worker's claim pass finds nothing while the batch's last job runs; the
    job then ends (its finish queues the batch's ``then``) and the worker lets it go
    before the pass is judged. The burst is not over: the ``then`` was due before it
    could end, and runs. A success is finished with a claim (on PostgreSQL one
    statement, whose claim cannot see the ``then`` it inserts), a failure on its own
    beside the main loop."""
    gate, at_pass, judge = tmp_path / "gate", tmp_path / "at-pass", tmp_path / "judge"
    let_go, go_on = tmp_path / "let-go", tmp_path / "go-on"
    last = JobSubmission.create(
        "ordering.row",
        {"n": 0, "gate": str(gate), "fail_first": ending == "fails"},
        max_attempts=1,
    )
    submit_batch(SCOPE, "last-1", [("last-1-0", last)], then=THEN)
    proc = workers(
        "--burst",
        "--concurrency",
        "1",
        env={
            "JOBS_FAULT": f"jobs.worker.nothing_claimed@1:pause:{at_pass}:{judge}",
            "ORDERS_FAULT": f"jobs.worker.done_with@1:pause:{let_go}:{go_on}",
        },
    )
    wait_until(at_pass.exists, 60, "a claim pass to find nothing while the job runs", proc)
    gate.touch()
    wait_until(let_go.exists, 60, "the worker to let the job go", proc)
    judge.touch()
    go_on.touch()
    assert proc.wait(120) == 0, proc.output
    last_status = JobStatus.FAILED if ending == "fails" else JobStatus.SUCCEEDED
    assert Job.objects.get(job_id="last-1-0").status == last_status
    then = Job.objects.get(job_id="last-1:then")
    assert then.status == JobStatus.SUCCEEDED, proc.output
