"""The recovery engine behind ``manage.py recover_sagas``: :class:`SagaRunner`
finds unfinished saga instances whose lease is free or expired, claims them and
drives each to its end with a :class:`~sagas.driver.Driver`.

``SagaRunner`` is an engine (:mod:`ledon.engine`): while the database is unreachable
it backs off and says so once per outage, and when it is back it releases what it
still holds — the instance whose driving the outage interrupted, or one it claimed
as the database failed — so that it is resumed at once (not after its lease, and
not counted as a takeover). A second stop request cancels the running step (the
instance is released, not compensated); a third stops waiting for it.

Fault points (see :mod:`ledon.faults`; the steps' own are listed in
:mod:`sagas.driver`), for crash tests:

``sagas.runner.started``
    ``recover_sagas`` started; it has not looked for instances yet (``runner_id``).
``sagas.runner.claimed``
    ``recover_sagas`` claimed an instance (``instance_id``) and is about to drive it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connections

from ledon.burst import Member
from ledon.clock import now as database_now
from ledon.db import DATABASE_ERRORS, alias_for, in_test_case_transaction
from ledon.engine import FAILED, Engine, EngineStats, Failed, StopLevel
from ledon.faults import fault_point
from ledon.registry import EngineRecord

from . import store, validation
from .conf import sagas_settings
from .driver import Driver, EventCallback, default_runner_id
from .exceptions import SagaDefinitionMismatch, SagaError, SagaLeaseLost, UnknownSaga
from .models import SagaInstance
from .registry import SagaDefinition, get_saga, registered_sagas
from .types import SagaSnapshot, SagaStatus

logger = logging.getLogger(__name__)

#: Instances deleted per retention transaction.
_PURGE_BATCH = 1000


@dataclass(slots=True)
class RecoveryStats(EngineStats):
    claimed: int = 0
    succeeded: int = 0
    compensated: int = 0
    needs_attention: int = 0
    released: int = 0
    lost: int = 0
    errors: int = 0
    #: Claims another runner won first.
    claims_lost: int = 0
    #: Instances left untouched because their definition is missing or changed.
    untouched: int = 0
    #: Finished instances deleted past the retention (``SAGAS["RETENTION_SECONDS"]``).
    purged: int = 0

    #: How an instance this runner drove ended (still active: released).
    counters = {
        SagaStatus.FAILED: "needs_attention",
        SagaStatus.RUNNING: "released",
        SagaStatus.COMPENSATING: "released",
    }

    def summary(self) -> str:
        return (
            f"claimed {self.claimed}: succeeded {self.succeeded}, compensated "
            f"{self.compensated}, needs attention {self.needs_attention}, released "
            f"{self.released}, lost to another runner {self.lost}, errors {self.errors}; "
            f"claims another runner won first {self.claims_lost}; left untouched "
            f"{self.untouched}; purged {self.purged}"
        )


class SagaRunner(Engine):
    """Recover unfinished saga instances until stopped (or, with ``burst``, until none
    is left to claim).

    An instance is claimable when it is running or compensating and its lease is free
    or expired: its runner crashed, stopped, or it was only started (``start_saga``).
    Claiming is one conditional update, so of several runners exactly one gets each
    instance; the claimer drives it like ``run_saga`` would, renewing the lease.
    An instance whose saga is not registered here (or no longer has its stored steps)
    is reported once and left untouched.
    """

    kind = "saga runner"
    app_label = "sagas"

    def __init__(
        self,
        *,
        runner_id: str | None = None,
        burst: bool = False,
        names: Iterable[str] | None = None,
        clock: Callable[[], datetime] = database_now,
        on_event: EventCallback | None = None,
        batch_size: int = 20,
        inline: bool | None = None,
        burst_member: Member | None = None,
    ) -> None:
        self.runner_id = validation.text(
            runner_id or default_runner_id(), "runner id", validation.MAX_OWNER_LENGTH
        )
        self.burst = burst
        #: With ``burst``, inside a burst worker: this runner's part in the worker's
        #: burst (:mod:`ledon.burst`): it ends once the burst is over, not when it
        #: alone finds nothing to claim.
        self.burst_member = burst_member
        self.names = None if names is None else set(names)
        self.clock = clock
        self.on_event = on_event
        self.batch_size = batch_size
        self.settings = sagas_settings()
        super().__init__(alias=alias_for(SagaInstance), log=logger)
        # Inside a test case's transaction, steps must run on this thread (see Driver).
        self.inline = (
            in_test_case_transaction(connections[self.alias]) if inline is None else inline
        )
        self.stats = RecoveryStats()
        self._reported: set[uuid.UUID] = set()
        # After a database error: instances still leased to this runner, which drives
        # none, are released once the database is back.
        self._release_pending = False
        self._driver: Driver | None = None
        # When the next retention clean-up is due (None: at the first loop).
        self._next_cleanup: datetime | None = None

    def _stop_level_reached(self, level: StopLevel) -> None:
        driver = self._driver
        if driver is None:
            return
        if level >= StopLevel.ABORT:
            driver.abandon()
        elif level >= StopLevel.CANCEL:
            driver.interrupt()

    def registry_record(self) -> EngineRecord:
        return EngineRecord(
            kind=self.kind, engine_id=self.runner_id, queues=tuple(sorted(self.names or ()))
        )

    def running_count(self) -> int:
        return 0 if self._driver is None else 1

    def _emit(self, event: str, state: SagaSnapshot | None, detail: str = "") -> None:
        if self.on_event is not None:
            self.on_event(event, state, detail)

    def run(self) -> RecoveryStats:
        logger.info("saga runner %s starting", self.runner_id, extra={"runner_id": self.runner_id})
        try:
            if not self.wait_for_database():
                self._emit("stopped", None, self.stats.summary())
                return self.stats
            self.started.set()
            fault_point("sagas.runner.started", runner_id=self.runner_id)
            self._emit("started", None, f"sagas: {', '.join(self._known_names()) or 'none'}")
            member = self.burst_member
            while not self._stopping.is_set():
                self._wake.clear()
                if member is not None and member.over:
                    break
                mark = 0 if member is None else member.mark()
                worked: bool | Failed = False
                if self._release_pending:
                    worked = self.guarded("releasing interrupted instances", self._release_own)
                if worked is not FAILED and self._cleanup_due():
                    cleaned = self.guarded("deleting finished instances", self.clean_up)
                    worked = FAILED if cleaned is FAILED else worked
                if worked is not FAILED:
                    worked = self.guarded("looking for saga instances to recover", self.recover_one)
                if worked is FAILED:
                    self._release_pending = True  # a claim may have committed unanswered
                if worked is not FAILED and worked:
                    if member is not None:
                        member.worked()  # what it committed may be the others' work
                    continue
                if worked is not FAILED and self.burst and (member is None or member.quiet(mark)):
                    break
                self.pause(self.settings.POLL_INTERVAL)
        finally:
            if self.burst_member is not None:
                self.burst_member.leave()
            if not self.inline:
                connections[self.alias].close()
        self._emit("stopped", None, self.stats.summary())
        return self.stats

    def _cleanup_due(self) -> bool:
        if self.settings.RETENTION_SECONDS is None:
            return False
        return self._next_cleanup is None or self.clock() >= self._next_cleanup

    def clean_up(self) -> int:
        """Retention: delete Succeeded and Compensated instances that finished more
        than ``SAGAS["RETENTION_SECONDS"]`` ago, a bounded batch per transaction;
        returns how many. The next clean-up is due ``CLEANUP_INTERVAL`` later."""
        now = self.clock()
        self._next_cleanup = now + timedelta(seconds=self.settings.CLEANUP_INTERVAL)
        seconds = self.settings.RETENTION_SECONDS
        if seconds is None:
            return 0
        cutoff = now - timedelta(seconds=seconds)
        purged = 0
        while count := store.purge_finished(older_than=cutoff, limit=_PURGE_BATCH):
            purged += count
            if count < _PURGE_BATCH or self._stopping.is_set():
                break
        if purged:
            self.stats.purged += purged
            self._emit("purged", None, f"{purged} finished instance(s) past retention")
        return purged

    def _known_names(self) -> list[str]:
        names = [d.name for d in registered_sagas()]
        return names if self.names is None else [n for n in names if n in self.names]

    def recover_one(self) -> bool:
        """Claim and drive one instance; False if none could be claimed."""
        now = self.clock()
        known = self._known_names()
        self._report_unknown(now, known)
        candidates = store.claimable(
            now, names=known, exclude_ids=self._reported, limit=self.batch_size
        )
        for candidate in candidates:
            if self._stopping.is_set():
                return False
            definition = get_saga(candidate.name)
            try:
                definition.check_plan(candidate.steps)
            except SagaDefinitionMismatch as exc:
                self._untouched(candidate, str(exc))
                continue
            claimed = store.claim(
                candidate,
                self.runner_id,
                lease_seconds=self.settings.LEASE_SECONDS,
                now=self.clock(),
            )
            if claimed is None:
                self.stats.claims_lost += 1
                continue
            self.stats.claimed += 1
            self._emit(
                "claimed",
                claimed,
                f"{claimed.status.value}; completed {list(claimed.completed_steps)}",
            )
            fault_point("sagas.runner.claimed", instance_id=claimed.instance_id)
            self._drive(definition, claimed)
            return True
        return False

    def _report_unknown(self, now: datetime, known: list[str]) -> None:
        if self.names is not None:
            return  # told to recover only some sagas: the others are not this runner's
        for state in store.claimable(
            now, exclude_names=known, exclude_ids=self._reported, limit=self.batch_size
        ):
            try:
                get_saga(state.name)
            except UnknownSaga as exc:
                self._untouched(state, str(exc))

    def _untouched(self, state: SagaSnapshot, reason: str) -> None:
        self._reported.add(state.instance_id)
        self.stats.untouched += 1
        logger.error(
            "saga instance %s (%s) cannot be recovered and is left untouched: %s",
            state.instance_id,
            state.name,
            reason,
            extra={"saga": state.name, "instance_id": str(state.instance_id)},
        )
        self._emit("untouched", state, reason)

    def _release_own(self) -> bool:
        """Release the instances still leased to this runner while it drives none (a
        database error interrupted their driving, or their claim committed as the
        database failed), so that they are claimed again at once — a release, not an
        expired lease, so not a takeover. True if any was released."""
        held = SagaInstance.objects.using(self.alias).filter(
            leased_by=self.runner_id, status__in=[SagaStatus.RUNNING, SagaStatus.COMPENSATING]
        )
        released = False
        for instance_id in held.values_list("instance_id", flat=True):
            state = store.get(instance_id)
            if state is None or state.leased_by != self.runner_id:
                continue
            try:
                store.release(state, self.runner_id, now=self.clock())
            except SagaLeaseLost:
                # Its lease had expired and another runner took it over (or it
                # moved on) since it was read: it is not this runner's to release.
                continue
            self._emit("released", state, "after a database error")
            released = True
        self._release_pending = False
        return released

    def _drive(self, definition: SagaDefinition, state: SagaSnapshot) -> None:
        driver = Driver(
            definition,
            self.runner_id,
            clock=self.clock,
            on_event=self.on_event,
            stopping=self._stopping,
            inline=self.inline,
            on_database_error=self.database_failed,
        )
        self._driver = driver
        if self._cancelling.is_set():
            self._stop_level_reached(self.stop_level)  # a request came as it started
        try:
            final = driver.drive(state)
        except SagaLeaseLost as exc:
            self.stats.lost += 1
            logger.warning("%s", exc, extra={"runner_id": self.runner_id})
            return
        except DATABASE_ERRORS as exc:
            self.stats.errors += 1
            self._release_pending = True
            self.database_failed(f"driving saga instance {state.instance_id}", exc)
            self._emit("error", state, f"{type(exc).__name__}: {exc}")
            return
        except SagaError as exc:
            self.stats.errors += 1
            logger.exception(
                "driving saga instance %s failed; its lease will expire and it will be "
                "recovered again",
                state.instance_id,
                extra={"runner_id": self.runner_id, "instance_id": str(state.instance_id)},
            )
            self._emit("error", state, f"{type(exc).__name__}: {exc}")
            self.reset_connection()
            return
        finally:
            self._driver = None
        self.stats.count(final.status)
