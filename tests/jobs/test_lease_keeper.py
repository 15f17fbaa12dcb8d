"""The lease keeper's reading of the heartbeat: an attempt that ended elsewhere
stops its running handler and is reported lost; an attempt whose handler already
returned has nothing to stop and is not reported."""

from __future__ import annotations

import pytest

from jobs import JobSubmission, execution, submit_job
from jobs.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def held(handler):
    """A worker holding two claims, and its events; neither handler runs (the
    worker's loop is not started)."""

    @handler("keeper.noop")
    def run(ctx):
        return "done"

    for n in range(2):
        submit_job("keeper", f"k{n}", JobSubmission.create("keeper.noop", {}))
    events: list[tuple[str, str]] = []

    def on_event(event, claim, detail):
        events.append((event, claim.job_id if claim else ""))

    worker = Worker(listen=False, on_event=on_event)
    claims = execution.claim_due(worker.worker_id, limit=2)
    assert len(claims) == 2
    entries = {}
    with worker.holdings.lock:
        for claim in claims:
            entries[claim.job_id] = worker.holdings.add_locked(claim)
    return worker, claims, entries, events


def test_an_attempt_ended_elsewhere_stops_its_running_handler(held):
    worker, claims, entries, events = held
    running = claims[0]
    execution.recover(running.token)  # ended elsewhere, as recovery would
    worker.leases.heartbeat()
    assert ("lost", running.job_id) in events
    assert entries[running.job_id].ctx.cancel_requested
    other = entries[claims[1].job_id]
    assert not other.ctx.cancel_requested


def test_a_returned_attempt_whose_end_committed_unseen_is_not_reported_lost(held):
    worker, claims, entries, events = held
    returned = claims[0]
    entries[returned.job_id].returned = True
    # Its settle committed, but the answer never reached the worker.
    assert execution.complete(returned.token, "done")
    worker.leases.heartbeat()
    assert not [e for e in events if e[0] == "lost"]
    assert not entries[returned.job_id].ctx.cancel_requested
