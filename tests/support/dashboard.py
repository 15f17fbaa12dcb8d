"""A known workload for the dashboard's tests (the page in a test client and in a
browser): what it writes, through the apps' own APIs, and the numbers the page must
show for it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from jobs import JobSubmission, execution, submit_job
from jobs.observability.worker_registry import DatabaseRegistry
from ledon.registry import EngineRecord
from outbox import IntegrationEvent, store, unit_of_work


@dataclass(frozen=True)
class DashboardPing(IntegrationEvent, name="tests.dashboard_ping"):
    n: int


def _reserve(ctx) -> None:
    ctx.data["reserved"] = True


def _stuck(ctx) -> None:
    raise RuntimeError("the warehouse is closed")


def _charge(ctx) -> None:
    raise RuntimeError("card declined")


def make_workload(settings) -> None:
    """Queue dash-a: 3 succeeded and 1 failed this hour, 2 queued (one due 5 minutes
    ago), 1 running; queue dash-b: 1 queued for later. A live worker and a silent
    one; 2 pending outbox messages and 1 parked; 1 saga needing attention."""
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": True}
    settings.SAGAS = {**settings.SAGAS, "COMPENSATION_ATTEMPTS": 1}
    now = timezone.now()
    a = {"queue": "dash-a"}
    for n in range(3):
        submit_job("dash", f"ok-{n}", JobSubmission.create("demo.report", {"n": n}, **a))
    submit_job("dash", "bad", JobSubmission.create("demo.flaky", {}, **a))
    for claim in execution.claim_due("dash-worker", limit=4, queues=["dash-a"]):
        if claim.job_id == "bad":
            execution.fail(claim.token, "RuntimeError: simulated")
        else:
            execution.complete(claim.token, "done")
    submit_job("dash", "run", JobSubmission.create("demo.export", {}, **a))
    assert execution.claim_due("dash-worker", limit=1, queues=["dash-a"])
    five_ago = now - timedelta(minutes=5)
    long_due = JobSubmission.create("demo.report", {}, not_before=five_ago, **a)
    submit_job("dash", "waiting-long", long_due)
    submit_job("dash", "waiting", JobSubmission.create("demo.report", {}, **a))
    later = now + timedelta(hours=1)
    submit_job(
        "dash", "later", JobSubmission.create("demo.report", {}, queue="dash-b", not_before=later)
    )

    registry = DatabaseRegistry()
    registry.register(
        EngineRecord(kind="worker", engine_id="dash-live", queues=("dash-a",), concurrency=4),
        running=1,
        now=now,
    )
    registry.register(
        EngineRecord(kind="dispatcher", engine_id="dash-silent"),
        running=0,
        now=now - timedelta(minutes=10),
    )

    with unit_of_work() as uow:
        envelopes = [uow.add_integration_event(DashboardPing(n)) for n in range(3)]
    store.park(envelopes[0].message_id, "poison")

    from sagas import SagaExecutionError, run_saga, saga
    from sagas.registry import unregister

    saga("dash-order").step("reserve", _reserve, compensate=_stuck).step("charge", _charge)
    try:
        run_saga("dash-order", data={})
    except SagaExecutionError:
        pass
    finally:
        unregister("dash-order")
