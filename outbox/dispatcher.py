"""The outbox dispatcher engine behind ``manage.py dispatch_outbox``.

A :class:`Dispatcher` claims a batch of due messages (a lease, attempt n+1), hands
it to the transport, and records each confirmation: delivered messages become Sent,
failed ones are retried with exponential backoff and parked after
``OUTBOX["MAX_ATTEMPTS"]`` attempts. Nothing is held open while the transport
publishes: if the process dies mid-batch, the lease expires, another dispatcher (or
this one restarted with the same id, at once) recovers the batch and delivers it
again. Delivery is at least once; consumers de-duplicate on the message id.

On PostgreSQL a listener thread wakes the dispatcher when a message commits (NOTIFY
sent in the writing transaction); elsewhere it polls every ``POLL_INTERVAL``. While
the database is unreachable it backs off and says so once per outage (see
:mod:`ledon.engine`); a batch it published is recorded as soon as the database is
back.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections

from ledon.backoff import RetryPace
from ledon.clock import now as database_now
from ledon.db import DATABASE_ERRORS, alias_for, is_postgres
from ledon.engine import FAILED, ClaimStats, EmitsEvents, Engine, EventCallback
from ledon.errors import format_error, send_logged
from ledon.pglisten import Listener
from ledon.registry import EngineRecord

from . import store
from .conf import outbox_settings
from .exceptions import TransportUnavailable
from .faults import fault_point
from .models import OutboxMessage
from .observability.hooks import publishing
from .signals import deliveries_recorded
from .transports import get_transport
from .transports.base import Transport
from .types import Batch, DeliveryReport, Envelope, RecordOutcome, RecoveryResult

logger = logging.getLogger(__name__)


def default_dispatcher_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(slots=True)
class DispatcherStats(ClaimStats):
    """What one ``run()`` of the dispatcher did, printed as the last line of
    ``dispatch_outbox``."""

    batches: int = 0
    sent: int = 0
    parked: int = 0

    counters = {RecordOutcome.RETRY_SCHEDULED: "retried"}

    def counted(self) -> str:
        return (
            f"claimed {self.claimed} in {self.batches} batch(es), sent {self.sent}, "
            f"retries scheduled {self.retried}, parked {self.parked}, "
            f"recovered {self.recovered}, purged {self.purged}"
        )


class _BatchLeaseKeeper(threading.Thread):
    """Renews the lease of the batch its dispatcher is publishing, every third of
    ``LEASE_SECONDS`` while the publishing lasts, so that a slow broker never lets
    another dispatcher recover the batch and send it a second time.

    One idle thread per dispatcher; it touches the database only when a publish
    outlasts a third of the lease (and closes its connection after each renewal).
    """

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__(name="outbox-lease", daemon=True)
        self.dispatcher = dispatcher
        self.interval = dispatcher.settings.LEASE_SECONDS / 3
        self._cond = threading.Condition()
        self._batch: Batch | None = None
        self._due = 0.0
        self._closed = False

    def watch(self, batch: Batch) -> None:
        with self._cond:
            self._batch = batch
            self._due = time.monotonic() + self.interval
            self._cond.notify()

    def unwatch(self, batch: Batch | None = None) -> None:
        """Stop renewing (only ``batch``'s lease, if given)."""
        with self._cond:
            if batch is None or self._batch is batch:
                self._batch = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._batch is None or time.monotonic() < self._due):
                    self._cond.wait(
                        None if self._batch is None else max(self._due - time.monotonic(), 0)
                    )
                if self._closed:
                    return
                batch = self._batch
                self._due = time.monotonic() + self.interval
            assert batch is not None
            self._renew(batch)

    def _renew(self, batch: Batch) -> None:
        dispatcher = self.dispatcher
        began = dispatcher.outage.clock()
        try:
            kept = store.renew_batch(batch.token, now=dispatcher.clock())
        except DATABASE_ERRORS as exc:
            dispatcher.database_failed(
                "renewing the lease of a batch being published", exc, began=began
            )
            return
        finally:
            connections.close_all()
        dispatcher.database_ok()
        if kept:
            dispatcher._emit("renewed", f"lease of {kept} message(s) renewed while publishing")
            return
        logger.warning(
            "an outbox batch of %d message(s) lost its lease while publishing; its late "
            "record will be fenced off",
            len(batch.messages),
            extra={"worker": dispatcher.dispatcher_id},
        )
        self.unwatch(batch)


class Dispatcher(EmitsEvents, Engine):
    """Deliver outbox messages until stopped (or, with ``burst``, until none is due).

    ``run()`` blocks; ``stop()`` may be called from any thread (for signals, see
    :meth:`~ledon.engine.Engine.stop_on_signals`): the batch being published is
    finished and recorded, then ``run()`` returns. An abort (the third stop request)
    stops retrying to record it: the lease expires and the batch is delivered again.
    """

    kind = "dispatcher"
    app_label = "outbox"

    def __init__(
        self,
        *,
        dispatcher_id: str | None = None,
        transport: Transport | None = None,
        batch_size: int | None = None,
        burst: bool = False,
        clock: Callable[[], datetime] = database_now,
        listen: bool | None = None,
        on_event: EventCallback | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.settings = outbox_settings()
        self.dispatcher_id = dispatcher_id or default_dispatcher_id()
        self.transport = transport or get_transport()
        self.batch_size = batch_size or self.settings.BATCH_SIZE
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.burst = burst
        self.clock = clock
        self.on_event = on_event
        self.rng = rng or random.Random()
        super().__init__(alias=alias_for(OutboxMessage), log=logger)
        self.listen = is_postgres(connections[self.alias]) if listen is None else listen
        self.stats = DispatcherStats()
        #: Set while the dispatcher waits for work (nothing was due at its last claim).
        self.idle = threading.Event()
        self._listener: Listener | None = None
        self._keeper: _BatchLeaseKeeper | None = None
        self._running = False
        # Whether what this dispatcher id holds was released: at start-up (an earlier
        # run's batch), and after a batch failed on the database (a claim that
        # committed as the database failed, a batch it could not record).
        self._own_recovered = False

    # ------------------------------------------------------------------ control

    def registry_record(self) -> EngineRecord:
        return EngineRecord(kind=self.kind, engine_id=self.dispatcher_id)

    # ------------------------------------------------------------------ main loop

    def run(self) -> DispatcherStats:
        logger.info(
            "outbox dispatcher %s starting",
            self.dispatcher_id,
            extra={"worker": self.dispatcher_id, "transport": self.transport.name},
        )
        if not self.wait_for_database():
            self.transport.close()
            self._emit("stopped", self.stats.summary())
            return self.stats
        if self.listen:
            self._listener = Listener(
                self.alias,
                [self.settings.NOTIFY_CHANNEL],
                lambda channel, payload: self._wake.set(),
                name="outbox-listener",
                database=self.settings.LISTEN_DATABASE,
            )
            self._listener.start()
        self._running = True
        try:
            self._check_transport()
            self._recover_own()
            self.guarded("retention clean-up", self.clean_up)
            self.started.set()
            self._emit("started", f"transport {self.transport.name or type(self.transport)}")
            self._loop_until_stopped()
        finally:
            self._running = False
            if self._keeper is not None:
                self._keeper.close()
                self._keeper = None
            if self._listener is not None:
                self._listener.stop()
                self._listener.join(timeout=5)
            self.transport.close()
            if not connections[self.alias].in_atomic_block:
                # A dispatcher run inside a test's transaction leaves it to the test.
                connections[self.alias].close()
        self._emit("stopped", self.stats.summary())
        return self.stats

    def _loop_until_stopped(self) -> None:
        s = self.settings
        next_recovery = time.monotonic() + s.RECOVERY_INTERVAL
        next_cleanup = time.monotonic() + s.CLEANUP_INTERVAL
        while not self._stopping.is_set():
            self._wake.clear()
            now = time.monotonic()
            if not self._own_recovered:
                self._recover_own()
            if now >= next_recovery:
                self.guarded("recovering batches", self.recover)
                next_recovery = now + s.RECOVERY_INTERVAL
            if now >= next_cleanup:
                self.guarded("retention clean-up", self.clean_up)
                next_cleanup = now + s.CLEANUP_INTERVAL
            claimed = self.guarded("dispatching a batch", self.dispatch_batch)
            if claimed is FAILED:
                self._own_recovered = False
            elif claimed:
                continue  # messages may have been waiting behind this batch, or retries
            if claimed is not FAILED and self.burst:
                break
            timeout = min(s.POLL_INTERVAL, next_recovery - now, next_cleanup - now)
            self.idle.set()
            self.pause(max(timeout, 0.01))
            self.idle.clear()

    def _recover_own(self) -> None:
        """Release this id's own leased messages before it claims again — it holds no
        batch between two — so that they go out at once, not after their lease."""
        if self.guarded("recovering batches", lambda: self.recover(startup=True)) is not FAILED:
            self._own_recovered = True

    def _check_transport(self) -> None:
        try:
            self.transport.check()
        except TransportUnavailable as exc:
            # Messages stay Pending and are retried: nothing is lost meanwhile.
            logger.warning(
                "outbox transport unavailable at start-up: %s",
                exc,
                extra={"worker": self.dispatcher_id, "transport": self.transport.name},
            )
            self._emit("transport-unavailable", str(exc))

    # ------------------------------------------------------------------ one batch

    def dispatch_batch(self) -> int:
        """Claim, publish and record one batch; the number of messages claimed."""
        started = time.monotonic()
        batch = store.claim_batch(self.dispatcher_id, limit=self.batch_size, now=self.clock())
        if batch is None:
            return 0
        self.stats.batches += 1
        self.stats.claimed += len(batch.messages)
        fault_point("outbox.dispatcher.claimed", batch=batch)
        with self._lease_kept(batch), publishing(batch.messages, self.transport.name) as spans:
            reports = self._publish(batch, spans.messages)
            spans.reported(reports)
        fault_point("outbox.dispatcher.published", batch=batch, reports=reports)
        outcomes = self._record(batch, reports)
        fault_point("outbox.dispatcher.recorded", batch=batch, outcomes=outcomes)
        for outcome in outcomes.values():
            self.stats.count(outcome)
        send_logged(
            deliveries_recorded, Dispatcher, "deliveries_recorded", log=logger,
            dispatcher=self, outcomes=outcomes, messages=batch.messages,
        )  # fmt: skip
        sent = sum(1 for o in outcomes.values() if o is RecordOutcome.SENT)
        failed = [r for r in reports if not r.ok]
        detail = f"{len(batch.messages)} claimed, {sent} sent"
        if failed:
            parked = sum(1 for o in outcomes.values() if o is RecordOutcome.PARKED)
            detail += f", {len(failed)} failed ({parked} parked): {failed[0].error[:200]}"
        logger.info(
            "outbox batch: %s",
            detail,
            extra={
                "worker": self.dispatcher_id,
                "claimed": len(batch.messages),
                "sent": sent,
                "duration": round(time.monotonic() - started, 6),
            },
        )
        self._emit("batch", detail)
        return len(batch.messages)

    @contextmanager
    def _lease_kept(self, batch: Batch) -> Iterator[None]:
        """While the batch publishes, keep its lease (see :class:`_BatchLeaseKeeper`)."""
        if self._keeper is None or not self._keeper.is_alive():
            self._keeper = _BatchLeaseKeeper(self)
            self._keeper.start()
        self._keeper.watch(batch)
        try:
            yield
        finally:
            self._keeper.unwatch()
            if not self._running:
                # A batch dispatched outside run(): nothing closes the keeper later.
                self._keeper.close()
                self._keeper = None

    def _publish(self, batch: Batch, messages: Sequence[Envelope]) -> list[DeliveryReport]:
        """The transport's report for every message of the batch (``messages``: as they
        are published, trace context included); a message it did not confirm, or a
        batch it raised on, counts as failed."""
        try:
            returned: Sequence[DeliveryReport] = self.transport.publish(messages)
        except Exception as exc:
            logger.warning(
                "outbox transport failed on a batch: %s",
                exc,
                exc_info=True,
                extra={"worker": self.dispatcher_id, "messages": len(messages)},
            )
            error = format_error(exc)
            return [DeliveryReport.failed(m.message_id, error) for m in batch.messages]
        by_id: dict[uuid.UUID, DeliveryReport] = {r.message_id: r for r in returned}
        return [
            by_id.get(m.message_id)
            or DeliveryReport.failed(m.message_id, "the transport did not confirm this message")
            for m in batch.messages
        ]

    def _record(
        self, batch: Batch, reports: list[DeliveryReport]
    ) -> dict[uuid.UUID, RecordOutcome]:
        """Record the outcomes, retrying with the engine's back-off while the database
        is unreachable (other database errors a few times); if it gives up, the lease
        expires and the batch is recovered and delivered again."""

        def record() -> dict[uuid.UUID, RecordOutcome]:
            now = self.clock()
            retry_at = {
                m.message_id: now + timedelta(seconds=self.retry_delay(m.attempt))
                for m in batch.messages
            }
            return store.record_deliveries(batch.token, reports, retry_at=retry_at, now=now)

        return self.retry_database("recording a published batch", record)

    def retry_delay(self, attempt: int) -> float:
        """Seconds before the attempt after failed attempt number ``attempt``."""
        return RetryPace.from_settings(self.settings).delay(attempt, self.rng)

    # ------------------------------------------------------------------ housekeeping

    def recover(self, *, startup: bool = False) -> RecoveryResult:
        """Release batches whose dispatcher stopped (lease expired; at start-up also
        this dispatcher id's own leftovers) so they are delivered again. At start-up,
        also repair the keys that producers of the previous release left
        (:func:`outbox.store.repair_keys`)."""
        if startup:
            fault_point("outbox.dispatcher.recovering", dispatcher_id=self.dispatcher_id)
        now = self.clock()
        result = store.recover_expired(now=now)
        if startup:
            own = store.recover_dispatcher(self.dispatcher_id, now=now)
            result = RecoveryResult(result.released + own.released, result.parked + own.parked)
            marked, released = store.repair_keys(now=now)
            if marked or released:
                logger.warning(
                    "repaired the order of keyed outbox messages stored by older code:"
                    " %d marked followed, %d released",
                    marked,
                    released,
                    extra={"worker": self.dispatcher_id},
                )
        if result.total:
            self.stats.recovered += result.released
            self.stats.parked += result.parked
            logger.warning(
                "recovered %d outbox message(s) of stopped dispatchers (%d parked)",
                result.total,
                result.parked,
                extra={"worker": self.dispatcher_id},
            )
            self._emit("recovered", f"{result.released} released, {result.parked} parked")
        return result

    def clean_up(self) -> int:
        """Retention: delete Sent and Parked messages and inbox records older than
        configured, a bounded batch per transaction."""
        s = self.settings
        now = self.clock()
        purged = 0
        for seconds, purge in (
            (s.RETENTION_SECONDS, store.purge_sent),
            (s.PARKED_RETENTION_SECONDS, store.purge_parked),
            (s.INBOX_RETENTION_SECONDS, store.purge_inbox),
        ):
            if seconds is None:
                continue
            cutoff = now - timedelta(seconds=seconds)
            while count := purge(older_than=cutoff):
                purged += count
                if self._stopping.is_set():
                    break
        if purged:
            self.stats.purged += purged
            self._emit("purged", f"{purged} old record(s)")
        return purged
