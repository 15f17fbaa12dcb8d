"""The executor engine behind ``manage.py run_jobs``.

A :class:`Worker` claims due jobs only for free capacity, runs their handlers on
threads started as work needs them (``async def`` handlers as tasks on one event
loop, with no thread each; at most its concurrency at once), renews the leases
of its running attempts by heartbeat, passes cancellation requests to handlers,
finishes each attempt, and recovers attempts whose worker died.

Every read and write of job state goes through :mod:`jobs.execution` (the trusted
executor API), fenced by the attempt's token: if this worker lost an attempt (it was
recovered elsewhere), its late result changes nothing. When the database is
unreachable the worker keeps what it knows (the attempts that ended, their results),
backs off, says so once per outage (see :mod:`ledon.engine`) and finishes them when
the database is back.

The worker is made of parts, each a class owning its state, composed by
:class:`Worker` (:mod:`~jobs.worker.engine`, the main loop). A part knows the worker
only through :class:`~jobs.worker.interfaces.WorkerInterface`, never the engine module:

- :class:`~jobs.worker.holdings.Holdings` — the attempts it holds, under its one lock;
- :class:`~jobs.worker.slots.Slots` — handler threads, their work queue
  (:mod:`~jobs.worker.workqueue`), the event loop, the LISTEN thread; how an attempt
  ended is decided by :func:`jobs.attempts.attempt_ended`;
- :class:`~jobs.worker.settler.Settler` — finishing returned attempts together with
  the next claim, one commit, capacity reserved so that the handlers running and
  the claims waiting never exceed the worker's capacity;
- :class:`~jobs.worker.finishing.Finisher` — one attempt's end written on its own,
  and the record (counts, log, signal, event) of every end;
- :class:`~jobs.worker.leases.LeaseKeeper` — heartbeat and cancellation watch;
- :class:`~jobs.worker.timeouts.TimeoutWatch` — handlers past their timeout;
- :class:`~jobs.worker.recovery.Recovery` — attempts of stopped workers;
- :class:`~jobs.worker.shutdown.ShutdownSequence` — the graceful shutdown.

Fault points (:func:`ledon.faults.fault_point`, for crash tests), each right after
the commit it names or right before the next one:

- ``jobs.worker.claimed`` (``job_id``, ``attempt``) — a claim committed: the attempt
  is Running in the database, its handler not started;
- ``jobs.worker.handler_returned`` (``job_id``, ``attempt``, ``ending``) — the
  handler returned or raised (its own commits done), the attempt's end not written;
- ``jobs.worker.settled`` (``finished``, ``claimed``) — a settle committed: returned
  attempts finished and new ones claimed, in one transaction;
- ``jobs.worker.finished`` (``job_id``, ``outcome``) — one attempt's end committed
  on its own (a failure, a put-back, a re-queue, a success outside a settle);
- ``jobs.worker.done_with`` (``job_id``) — the worker let the attempt go, its end
  committed: its place is free;
- ``jobs.worker.nothing_claimed`` — a claim pass of the main loop took nothing (before
  a burst judges whether it is over);
- ``jobs.worker.recovering`` (``worker_id``) — at start-up, before this worker id's
  leftovers of an earlier run are recovered (nothing of this run committed yet);
- ``jobs.worker.recovered`` (``count``) — recovered attempts (expired leases, this
  worker id's leftovers, claims lost with the database) committed.
"""

from __future__ import annotations

from .engine import Worker
from .holdings import EventCallback, WorkerStats

__all__ = ["EventCallback", "Worker", "WorkerStats"]
