"""What the worker's parts share: the attempts it runs, its counts and events, how one
attempt's end is written, and the heartbeat that watches the running attempts.

Each module of :mod:`jobs.worker` builds on the one before: this base, then
:mod:`~jobs.worker.settling`, :mod:`~jobs.worker.threads`,
:mod:`~jobs.worker.shutdown` and :mod:`~jobs.worker.engine`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from ledon.db import DATABASE_ERRORS
from ledon.engine import FAILED, Engine, EngineStats
from ledon.faults import fault_point
from ledon.pglisten import Listener

from .. import execution
from ..conf import JobsSettings
from ..handlers import HandlerSpec, JobContext
from ..log_fields import attempt_fields
from ..signals import finished_attempt
from ..types import CancelReason, Claim, ExecutionStatus, FinishOutcome

logger = logging.getLogger(__name__)

#: A callback for what the worker does: (event, claim or None, detail).
EventCallback = Callable[[str, Claim | None, str], None]


@dataclass(slots=True)
class WorkerStats(EngineStats):
    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    requeued: int = 0
    interrupted: int = 0
    stale: int = 0
    recovered: int = 0
    purged: int = 0
    put_back: int = 0
    snoozed: int = 0

    counters = {FinishOutcome.PUT_BACK: "put_back"}

    def summary(self) -> str:
        return (
            f"claimed {self.claimed}, succeeded {self.succeeded}, failed {self.failed}, "
            f"retries scheduled {self.retried}, cancelled {self.cancelled}, "
            f"re-queued {self.requeued}, recovered {self.recovered}, purged {self.purged}"
            + (f", put back (unknown handler) {self.put_back}" if self.put_back else "")
            + (f", snoozed {self.snoozed}" if self.snoozed else "")
            + (f", stale (fenced off) {self.stale}" if self.stale else "")
        )


@dataclass(slots=True)
class Running:
    """An attempt this worker holds: claimed, running, or finished and not yet settled."""

    claim: Claim
    ctx: JobContext
    #: J17: when (``time.monotonic()``) its handler is signalled to stop; None: never.
    deadline: float | None = None
    #: The handler, once it started (for a timeout's error and retry).
    spec: HandlerSpec | None = None
    #: The thread running the handler.
    thread: threading.Thread | None = None
    #: The handler returned (or raised): its thread writes the end.
    returned: bool = False
    #: J17: the handler outlived its timeout's grace; the worker failed the attempt and
    #: left the thread, whose late result is dropped (and fenced by the token).
    abandoned: bool = False


class WorkerBase(Engine):
    """The state every part of the worker reads, set up by :meth:`_init_state`."""

    # Set by Worker.__init__ before _init_state.
    concurrency: int
    queues: list[str]
    worker_id: str
    burst: bool
    listen: bool
    shutdown_timeout: float
    cancel_grace: float
    clock: Callable[[], datetime]
    on_event: EventCallback | None
    settings: JobsSettings

    def _init_state(self) -> None:
        self.stats = WorkerStats()
        #: The attempts this worker holds, by token.
        self._running: dict[str, Running] = {}
        self._lock = threading.Lock()
        self._check_cancel_now = threading.Event()
        self._tasks: queue.Queue[Claim | None] = queue.Queue()
        # Successful attempts whose handlers returned, waiting for the main loop to
        # finish them together with its next claim (one commit for the lot).
        self._completed: list[tuple[Claim, str | None]] = []
        self._settling = True
        # Settles under way, and the capacity their claims may still take.
        self._settles = 0
        self._reserved = 0
        self._threads: list[threading.Thread] = []
        self._spawned = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._listener: Listener | None = None
        # A claim failed on the database: it may have committed with its answer lost.
        self._claims_unknown = False

    # ------------------------------------------------------------------ state

    @property
    def running_tokens(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def running_count(self) -> int:
        with self._lock:
            return len(self._running)

    def _busy(self) -> bool:
        """Whether a handler runs or waits to run, or a settle is under way."""
        with self._lock:
            return bool(self._running) or self._settles > 0

    def _release(self, claim: Claim) -> None:
        with self._lock:
            self._running.pop(claim.token, None)
        self._wake.set()

    def _emit(self, event: str, claim: Claim | None = None, detail: str = "") -> None:
        if self.on_event is not None:
            self.on_event(event, claim, detail)

    # ------------------------------------------------------------------ one attempt's end

    def _committed[T](self, call: Callable[[], T], *, one_statement: bool = False) -> T:
        """Run the worker's own claim or finish ``call``: with
        ``JOBS["ASYNCHRONOUS_COMMIT"]`` on PostgreSQL, its commit does not wait for
        the WAL flush (``one_statement``: ``call`` is one statement in autocommit)."""
        if not self.settings.ASYNCHRONOUS_COMMIT:
            return call()
        with execution.asynchronous_commit(True, one_statement=one_statement):
            return call()

    def _finish(
        self, claim: Claim, event: str, call: Callable[[], FinishOutcome], detail: str = ""
    ) -> None:
        """Write the attempt's end, retrying with the engine's back-off while the
        database is unreachable (other database errors a few times). If it gives up
        — another error, or the worker aborts — the lease expires and another worker
        recovers the attempt."""
        try:
            outcome = self.retry_database(
                f"finishing job {claim.job_id}", lambda: self._committed(call)
            )
        except DATABASE_ERRORS:
            logger.warning(
                "finishing job %s failed; it is recovered when its lease expires",
                claim.job_id,
                extra=attempt_fields(claim),
            )
            return
        fault_point("jobs.worker.finished", job_id=claim.job_id, outcome=outcome.value)
        self._record(claim, event, outcome, detail)

    def _record(self, claim: Claim, event: str, outcome: FinishOutcome, detail: str = "") -> None:
        with self._lock:
            if outcome is FinishOutcome.REQUEUED and event == "failed":
                self.stats.retried += 1
                event = "retry-scheduled"
            else:
                self.stats.count(outcome)
                if outcome in (
                    FinishOutcome.CANCELLED,
                    FinishOutcome.STALE,
                    FinishOutcome.PUT_BACK,
                    FinishOutcome.SNOOZED,
                ):
                    event = outcome.value
        if logger.isEnabledFor(logging.INFO):  # its fields are not built for nothing
            logger.info(
                "job %s %s",
                claim.job_id,
                event,
                extra=attempt_fields(claim, now=self.clock(), outcome=outcome.value, event=event),
            )
        finished_attempt(claim, outcome, retry_scheduled=event == "retry-scheduled")
        self._emit(event, claim, detail)

    # ------------------------------------------------------------------ watching

    def _heartbeat(self) -> None:
        # J17: a timed-out attempt's lease is left to expire: its handler cannot keep
        # it alive (should this worker fail to end it, another recovers it).
        with self._lock:
            tokens = [t for t, entry in self._running.items() if not entry.ctx.timed_out]
        self._watch(
            lambda tokens: execution.heartbeat(tokens, self.worker_id, now=self.clock()),
            "lease renewal",
            tokens,
        )

    def _check_cancel(self) -> None:
        self._watch(execution.execution_statuses, "cancellation check", self.running_tokens)

    def _watch(
        self,
        read: Callable[[Sequence[str]], dict[str, ExecutionStatus]],
        what: str,
        tokens: list[str],
    ) -> None:
        """Read the attempts' states (renewing leases or not) and act on them."""
        if not tokens:
            return
        states = self.guarded(what, lambda: read(tokens))
        if states is not FAILED:
            self._apply(states)

    def _apply(self, states: dict[str, ExecutionStatus]) -> None:
        with self._lock:
            entries = {t: self._running.get(t) for t in states}
        for token, state in states.items():
            entry = entries[token]
            if entry is None or entry.ctx.cancel_requested:
                continue
            if state is ExecutionStatus.CANCEL_REQUESTED:
                self._emit("cancel-requested", entry.claim)
                entry.ctx.signal_cancel()
            elif state is ExecutionStatus.ENDED:
                # The attempt ended elsewhere (recovered after a lost lease); whatever
                # the handler returns now is fenced off by its token.
                self._emit("lost", entry.claim, "attempt ended elsewhere; stopping handler")
                entry.ctx.signal_cancel(CancelReason.LOST)
