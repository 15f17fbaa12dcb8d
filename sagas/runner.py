"""The engine that drives saga instances: :class:`Driver` runs one leased instance to
its end, :class:`SagaRunner` (``manage.py recover_sagas``) finds unfinished instances
whose lease expired, claims them and drives them.

Each step runs on a thread of its own, in a transaction of its own
(:class:`~sagas.db.StepAtomic`) with its own unit of work; its completion mark —
completed step, data, version + 1, guarded by the version the step started from and
by the lease holder — is written in that same transaction. A step that outlives its
timeout gets its cancellation signal; if it does not stop within
``SAGAS["CANCEL_GRACE_SECONDS"]`` the runner stops waiting, treats the step as failed
and starts compensating. Starting compensation moves the version on, so whatever the
late step does afterwards, its transaction can no longer commit its completion.

While it drives an instance, a runner renews the instance's lease from a thread of
its own; the version is not moved by renewals, so they never fence the running step.

``SagaRunner`` is an engine (:mod:`ledon.engine`): while the database is unreachable
it backs off and says so once per outage, and when it is back it releases what it
still holds — the instance whose driving the outage interrupted, or one it claimed
as the database failed — so that it is resumed at once (not after its lease, and
not counted as a takeover). A step that ends on an unreachable database has not
failed: it runs again, nothing is compensated for an outage. A second stop request cancels the
running step (the instance is released, not compensated); a third stops waiting for
it.

Fault points (see ``outbox.faults``), for crash tests:

``sagas.step.started``
    a step's transaction is open; its action is about to run (``step``, ``instance_id``).
``sagas.step.marked``
    the step's action returned and its completion mark is written, not committed.
``sagas.step.committed``
    the step's transaction, completion mark included, is committed.
``sagas.compensation.marked`` / ``sagas.compensation.committed``
    the same for a compensation.
``sagas.runner.started``
    ``recover_sagas`` started; it has not looked for instances yet (``runner_id``).
``sagas.runner.claimed``
    ``recover_sagas`` claimed an instance (``instance_id``) and is about to drive it.
"""

from __future__ import annotations

import copy
import logging
import os
import queue
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, close_old_connections, connections
from django.utils import timezone

from ledon.db import DATABASE_ERRORS, TRANSIENT_ERRORS, reset_connection
from ledon.engine import FAILED, Engine, Failed, StopLevel
from ledon.registry import EngineRecord
from outbox import unit_of_work
from outbox.faults import fault_point

from . import store, validation
from .conf import SagasSettings, sagas_settings
from .context import SagaContext
from .db import StepAtomic, alias_for, in_test_case_transaction, is_snapshot_conflict
from .exceptions import (
    InvalidTransition,
    SagaConcurrencyError,
    SagaDefinitionMismatch,
    SagaError,
    SagaLeaseLost,
    StepKeptDying,
    StepTimedOut,
    UnknownSaga,
)
from .models import SagaInstance
from .registry import SagaDefinition, SagaStep, get_saga, registered_sagas
from .telemetry import FINISHING_EVENTS, instance_finished, step_span, trace_context
from .types import SagaSnapshot, SagaStatus

logger = logging.getLogger(__name__)

#: A callback for what a runner does: (event, instance or None, detail).
EventCallback = Callable[[str, SagaSnapshot | None, str], None]

#: Runs of one step after SQLite refused to upgrade its read snapshot to a write.
SNAPSHOT_CONFLICT_RUNS = 5


def default_runner_id() -> str:
    """``host:pid:random`` — unique for every driver, so two never share a lease."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


#: Reports a database error of a step beside the main loop (the lease keeper).
DatabaseErrorReport = Callable[[str, Exception], object]


class _LeaseKeeper(threading.Thread):
    """Renews one instance's lease until stopped; reports a lost lease once."""

    def __init__(
        self,
        instance_id: uuid.UUID,
        owner: str,
        settings: SagasSettings,
        clock: Callable[[], datetime],
        on_lost: Callable[[], None],
        on_database_error: DatabaseErrorReport | None = None,
    ) -> None:
        super().__init__(name=f"saga-lease-{instance_id}", daemon=True)
        self.instance_id = instance_id
        self.owner = owner
        self.settings = settings
        self.clock = clock
        self.on_lost = on_lost
        self.on_database_error = on_database_error
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            while not self._stop_event.wait(self.settings.heartbeat_seconds):
                try:
                    kept = store.renew(
                        self.instance_id,
                        self.owner,
                        lease_seconds=self.settings.LEASE_SECONDS,
                        now=self.clock(),
                    )
                except DATABASE_ERRORS as exc:
                    if self.on_database_error is not None:
                        self.on_database_error("renewing the lease of a saga instance", exc)
                    else:
                        logger.exception(
                            "renewing the lease of saga instance %s failed; will retry",
                            self.instance_id,
                        )
                    reset_connection(alias_for(SagaInstance))
                    continue
                if not kept:
                    if not self._stop_event.is_set():
                        self.on_lost()
                    return
        finally:
            connections.close_all()


def _run_into(body: Callable[[], None], future: Future[None]) -> None:
    """Run ``body``; how it ends becomes ``future``'s result or exception."""
    try:
        body()
    except BaseException as exc:
        future.set_exception(exc)
    else:
        future.set_result(None)


class _StepThread(threading.Thread):
    """Runs the steps of the sagas one calling thread drives, one after another, on a
    thread of their own (so that a driver can give up on a step after its timeout).

    It outlives one saga: like a request thread, it keeps its database connection as
    ``CONN_MAX_AGE`` allows (:meth:`tidy` after each saga closes it when it is
    obsolete or unusable). Once a step is given up on, the thread is closed and the
    calling thread's next step gets a new one.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._tasks: queue.SimpleQueue[tuple[Callable[[], None], Future[None]] | None] = (
            queue.SimpleQueue()
        )

    def submit(self, body: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        self._tasks.put((body, future))
        return future

    def close(self) -> None:
        """End the thread after the step it runs, if any; its connection closes."""
        self._tasks.put(None)

    def tidy(self) -> None:
        """After a saga: close the connection if ``CONN_MAX_AGE`` says so."""
        self.submit(close_old_connections)

    def run(self) -> None:
        try:
            while (task := self._tasks.get()) is not None:
                _run_into(*task)
        finally:
            connections.close_all()


_step_threads = threading.local()


def _step_thread_for_caller() -> _StepThread:
    """The calling thread's step thread, started on first use."""
    thread: _StepThread | None = getattr(_step_threads, "thread", None)
    if thread is None:
        thread = _StepThread(f"saga-steps-{threading.current_thread().name}")
        thread.start()
        _step_threads.thread = thread
    return thread


def _drop_step_thread_of_caller() -> None:
    thread: _StepThread | None = getattr(_step_threads, "thread", None)
    if thread is not None:
        thread.close()
        _step_threads.thread = None


@dataclass(slots=True)
class _Outcome:
    """How one run of a step's action or compensation ended."""

    error: BaseException | None = None
    #: The step ignored its cancellation; its thread may still be running.
    abandoned: bool = False


class Driver:
    """Drive one instance, leased to ``owner``, until it ends, the lease is lost, or
    ``stopping`` is set (then the lease is released between two steps).

    ``inline`` is for code running inside a test case's transaction, which other
    connections cannot see: each step's thread then borrows the caller's connection.
    ``on_database_error`` reports the lease keeper's database errors (default: log
    each). :meth:`interrupt` and :meth:`abandon` are for a runner that shuts down.
    """

    def __init__(
        self,
        definition: SagaDefinition,
        owner: str,
        *,
        clock: Callable[[], datetime] = timezone.now,
        on_event: EventCallback | None = None,
        stopping: threading.Event | None = None,
        inline: bool = False,
        on_database_error: DatabaseErrorReport | None = None,
    ) -> None:
        self.definition = definition
        self.owner = owner
        self.clock = clock
        self.on_event = on_event
        self.stopping = stopping or threading.Event()
        self.inline = inline
        self.settings = sagas_settings()
        self.alias = alias_for(SagaInstance)
        #: The exception of the step that failed while this driver ran it, if any.
        self.failure: BaseException | None = None
        #: The last exception of a compensation that kept failing, if any.
        self.compensation_failure: BaseException | None = None
        self.on_database_error = on_database_error
        self._lost = threading.Event()
        self._current_cancel: threading.Event | None = None
        # Set by interrupt(): a step that then fails was cancelled by a shutdown, not
        # by its own fault, and is run again by the next runner (never compensated).
        self._interrupted = threading.Event()
        # Done by abandon(): stop waiting for the running step.
        self._abandoned: Future[None] = Future()

    # ------------------------------------------------------------------ helpers

    def _emit(self, event: str, state: SagaSnapshot | None, detail: str = "") -> None:
        if state is not None and event in FINISHING_EVENTS:
            instance_finished(state, event)
        if self.on_event is not None:
            self.on_event(event, state, detail)

    def _log_extra(self, state: SagaSnapshot, step: str = "") -> dict[str, Any]:
        return {
            "saga": state.name,
            "instance_id": str(state.instance_id),
            "step": step,
            "runner_id": self.owner,
        }

    def _lease_lost(self) -> None:
        self._lost.set()
        cancel = self._current_cancel
        if cancel is not None:
            cancel.set()

    def interrupt(self) -> None:
        """Cancel the running step now; the instance is released, not compensated."""
        self._interrupted.set()
        cancel = self._current_cancel
        if cancel is not None:
            cancel.set()

    def abandon(self) -> None:
        """Stop waiting for the running step (after :meth:`interrupt`)."""
        self.interrupt()
        if not self._abandoned.done():
            self._abandoned.set_result(None)

    @staticmethod
    def _raise_if_the_database_failed(outcome: _Outcome) -> None:
        """A step (or compensation) that ended on an unreachable database did not fail:
        its transaction rolled back, and it runs again once the database is back.
        Raised to the caller — a runner releases the instance then — instead of
        compensating (or giving up on a compensation) because of an outage."""
        if isinstance(outcome.error, TRANSIENT_ERRORS) and not outcome.abandoned:
            raise outcome.error

    def _stopped_short(self) -> bool:
        """Whether a failed step is to be left alone: the lease was lost, or a
        shutdown interrupted it."""
        return self._lost.is_set() or self._interrupted.is_set()

    # ------------------------------------------------------------------ main loop

    def drive(self, state: SagaSnapshot) -> SagaSnapshot:
        """Run the instance's remaining steps (or compensations); its final state."""
        self.definition.check_plan(state.steps)
        keeper: _LeaseKeeper | None = None
        if not self.inline:
            keeper = _LeaseKeeper(
                state.instance_id,
                self.owner,
                self.settings,
                self.clock,
                self._lease_lost,
                self.on_database_error,
            )
            keeper.start()
        try:
            self._fail_a_step_that_keeps_dying(state)
            while True:
                state = store.require(state.instance_id)
                if state.leased_by != self.owner:
                    if state.status.is_active:
                        self._emit("lease-lost", state, f"now leased by {state.leased_by!r}")
                        raise SagaLeaseLost(
                            f"saga instance {state.instance_id} was taken over by "
                            f"{state.leased_by or 'nobody'}; {self.owner} stopped driving it",
                            instance_id=state.instance_id,
                        )
                    return state
                if self.stopping.is_set():
                    store.release(state, self.owner, now=self.clock())
                    self._emit("released", state, "stopping")
                    return store.require(state.instance_id)
                if self.inline:
                    store.renew(
                        state.instance_id,
                        self.owner,
                        lease_seconds=self.settings.LEASE_SECONDS,
                        now=self.clock(),
                    )
                if state.status is SagaStatus.RUNNING:
                    self._forward(state)
                elif state.status is SagaStatus.COMPENSATING:
                    self._compensate(state)
                else:
                    return state
        finally:
            if keeper is not None:
                keeper.stop()
            if not self.inline:
                _step_thread_for_caller().tidy()

    def _fail_a_step_that_keeps_dying(self, state: SagaSnapshot) -> None:
        """A step whose runners kept dying (or hanging) without finishing it — the
        instance was taken over from an expired lease more than ``MAX_TAKEOVERS``
        times without moving on — counts as failed instead of being run once more:
        compensation begins, or, if a compensation keeps dying, the instance is left
        for a person (needs attention)."""
        limit = self.settings.MAX_TAKEOVERS
        if limit is None or state.takeovers <= limit or state.leased_by != self.owner:
            return
        compensating = state.status is SagaStatus.COMPENSATING
        todo = state.steps_to_compensate if compensating else state.pending_steps
        if not todo:
            return
        step = todo[0]
        what = "compensation of step" if compensating else "step"
        error = StepKeptDying(
            f"{what} {step!r} of saga {state.name!r} never finished: the runners driving "
            f"it stopped {state.takeovers} times (SAGAS['MAX_TAKEOVERS'] is {limit})"
        )
        logger.error(
            "saga %s instance %s: %s",
            state.name,
            state.instance_id,
            error,
            extra=self._log_extra(state, step),
        )
        self._emit("step-kept-dying", state, f"{step} after {state.takeovers} takeovers")
        if compensating:
            self.compensation_failure = error
            store.give_up(state, self.owner, str(error), now=self.clock())
            self._emit("needs-attention", state, f"compensation of {step} kept dying")
        else:
            self.failure = error
            store.begin_compensation(state, self.owner, step, str(error), now=self.clock())

    def _forward(self, state: SagaSnapshot) -> None:
        pending = state.pending_steps
        if not pending:
            raise InvalidTransition(
                f"saga instance {state.instance_id} is running with every step completed"
            )
        step = self.definition.get_step(pending[0])
        outcome = self._run(state, step, compensating=False)
        self._raise_if_the_database_failed(outcome)
        if outcome.error is None:
            self._emit("step-completed", state, step.name)
            if len(pending) == 1:
                self._emit("succeeded", state, "")
            return
        if self._stopped_short() or (
            isinstance(outcome.error, SagaConcurrencyError) and not outcome.abandoned
        ):
            # The instance changed under the step (a takeover) and the completion mark
            # was (or will be) fenced, or a shutdown cancelled the step: the loop
            # re-reads and stops.
            return
        self.failure = outcome.error
        logger.warning(
            "saga %s instance %s: step %r failed, compensating: %s",
            state.name,
            state.instance_id,
            step.name,
            outcome.error,
            extra=self._log_extra(state, step.name),
        )
        self._emit(
            "step-failed", state, f"{step.name}: {type(outcome.error).__name__}: {outcome.error}"
        )
        error = store.format_error(outcome.error)
        for _ in range(3):
            try:
                store.begin_compensation(state, self.owner, step.name, error, now=self.clock())
                return
            except SagaLeaseLost:
                raise
            except SagaConcurrencyError:
                # A late step committed its completion just before: compensate it too.
                state = store.require(state.instance_id)
                if state.status is not SagaStatus.RUNNING:
                    return
        raise SagaConcurrencyError(
            f"saga instance {state.instance_id} kept changing while compensation began",
            instance_id=state.instance_id,
        )

    def _compensate(self, state: SagaSnapshot) -> None:
        todo = state.steps_to_compensate
        if not todo:
            store.finish_compensation(state, self.owner, now=self.clock())
            self._emit("compensated", state, "")
            return
        step = self.definition.get_step(todo[0])
        if step.compensate is None:
            logger.warning(
                "saga %s instance %s: step %r has no compensation; its effects remain "
                "and may need a person's attention",
                state.name,
                state.instance_id,
                step.name,
                extra=self._log_extra(state, step.name),
            )
            store.skip_compensation(state, self.owner, step.name, now=self.clock())
            self._emit("no-compensation", state, step.name)
            return
        attempts = self.settings.COMPENSATION_ATTEMPTS
        delay = self.settings.COMPENSATION_RETRY_DELAY
        last: BaseException | None = None
        for attempt in range(1, attempts + 1):
            outcome = self._run(state, step, compensating=True, attempt=attempt)
            self._raise_if_the_database_failed(outcome)
            if outcome.error is None:
                self._emit("step-compensated", state, step.name)
                return
            if self._stopped_short() or (
                isinstance(outcome.error, SagaConcurrencyError) and not outcome.abandoned
            ):
                return
            last = outcome.error
            logger.warning(
                "saga %s instance %s: compensation of step %r failed (try %d of %d): %s",
                state.name,
                state.instance_id,
                step.name,
                attempt,
                attempts,
                last,
                extra=self._log_extra(state, step.name),
            )
            self._emit("compensation-failed", state, f"{step.name} (try {attempt}/{attempts})")
            if attempt < attempts:
                if self.stopping.wait(delay) or self._lost.is_set():
                    return  # the loop releases the lease or notices the takeover
                delay *= 2
        assert last is not None
        self.compensation_failure = last
        message = (
            f"compensation of step {step.name!r} failed {attempts} time(s); the last "
            f"error:\n{store.format_error(last)}"
        )
        store.give_up(state, self.owner, message, now=self.clock())
        logger.error(
            "saga %s instance %s needs attention: compensation of step %r kept failing",
            state.name,
            state.instance_id,
            step.name,
            extra=self._log_extra(state, step.name),
        )
        self._emit("needs-attention", state, f"compensation of {step.name} kept failing")

    # ------------------------------------------------------------------ one step

    def _run(
        self, state: SagaSnapshot, step: SagaStep, *, compensating: bool, attempt: int = 1
    ) -> _Outcome:
        cancel = threading.Event()
        self._current_cancel = cancel
        if self._stopped_short():
            cancel.set()
        # The step runs on a thread of its own: its span's parent is this thread's.
        parent = trace_context()

        def body() -> None:
            with step_span(state, step.name, compensating, attempt, parent):
                self._transaction(
                    state, step, compensating=compensating, attempt=attempt, cancel=cancel
                )

        try:
            return self._on_thread(body, state, step, cancel)
        finally:
            self._current_cancel = None

    def _on_thread(
        self, body: Callable[[], None], state: SagaSnapshot, step: SagaStep, cancel: threading.Event
    ) -> _Outcome:
        """Run ``body`` on the calling thread's step thread and wait for it, at most the step's
        timeout plus the cancellation grace.

        Inline, a thread of its own borrows this thread's connection (the test's
        transaction): then nothing else may use the connection until the step ends,
        so a step that ignores its cancellation is waited for — and still treated as
        failed.
        """
        if not self.inline:
            submitted = _step_thread_for_caller().submit(body)
            outcome = self._wait(submitted, state, step, cancel, False)
            if outcome.abandoned:
                _drop_step_thread_of_caller()  # it is still busy with the abandoned step
            return outcome
        future: Future[None] = Future()
        shared = connections[self.alias]

        def main() -> None:
            connections[self.alias] = shared
            try:
                _run_into(body, future)
            finally:
                del connections[self.alias]

        shared.inc_thread_sharing()
        try:
            thread = threading.Thread(
                target=main, name=f"saga-step-{state.name}-{step.name}", daemon=True
            )
            thread.start()
            return self._wait(future, state, step, cancel, True)
        finally:
            shared.dec_thread_sharing()

    def _wait(
        self,
        future: Future[None],
        state: SagaSnapshot,
        step: SagaStep,
        cancel: threading.Event,
        must_end: bool,
    ) -> _Outcome:
        timeout = step.timeout if step.timeout is not None else self.settings.STEP_TIMEOUT
        wait([future, self._abandoned], timeout, return_when=FIRST_COMPLETED)
        if future.done():
            return _Outcome(future.exception())
        if self._abandoned.done() and not must_end:
            return _Outcome(
                StepTimedOut(f"step {step.name!r} of saga {state.name!r} was abandoned"),
                abandoned=True,
            )
        cancel.set()
        self._emit("step-timeout", state, f"{step.name} after {timeout}s; cancellation signalled")
        wait([future], self.settings.CANCEL_GRACE_SECONDS)
        late = StepTimedOut(
            f"step {step.name!r} of saga {state.name!r} did not finish within {timeout}s"
        )
        if future.done():
            error = future.exception()
            if error is None:
                return _Outcome()  # it finished, and committed, just in time
            late.__cause__ = error
            return _Outcome(late)
        late = StepTimedOut(
            f"step {step.name!r} of saga {state.name!r} did not finish within {timeout}s "
            f"and ignored its cancellation for {self.settings.CANCEL_GRACE_SECONDS}s; "
            "it is treated as failed and can no longer commit"
        )
        logger.error(
            "saga %s instance %s: step %r ignored its cancellation; %s",
            state.name,
            state.instance_id,
            step.name,
            "waiting for it to end (it shares the test's connection)"
            if must_end
            else "abandoning it",
            extra=self._log_extra(state, step.name),
        )
        if must_end:
            # Its completion is refused (its cancellation is set), so its work rolls back.
            wait([future])
        return _Outcome(late, abandoned=True)

    def _transaction(
        self,
        state: SagaSnapshot,
        step: SagaStep,
        *,
        compensating: bool,
        attempt: int,
        cancel: threading.Event,
    ) -> None:
        """One step's transaction: the action (or compensation) and its mark."""
        function = step.compensate if compensating else step.action
        assert function is not None
        point = "sagas.compensation" if compensating else "sagas.step"
        where = {"saga": state.name, "instance_id": state.instance_id, "step": step.name}
        for run in range(1, SNAPSHOT_CONFLICT_RUNS + 1):
            try:
                with StepAtomic(self.alias), unit_of_work(using=self.alias) as uow:
                    ctx = SagaContext(
                        instance_id=state.instance_id,
                        saga_name=state.name,
                        step=step.name,
                        data=copy.deepcopy(state.data),
                        unit_of_work=uow,
                        compensating=compensating,
                        attempt=attempt,
                        cancel=cancel,
                    )
                    if not compensating:
                        fault_point("sagas.step.started", **where)
                    function(ctx)
                    ctx.raise_if_cancelled()
                    data = validation.data(ctx.data)
                    if compensating:
                        store.record_compensation(
                            state, self.owner, step.name, data, now=self.clock()
                        )
                    else:
                        store.complete_step(state, self.owner, step.name, data, now=self.clock())
                    fault_point(f"{point}.marked", **where)
                fault_point(f"{point}.committed", **where)
                return
            except DatabaseError as exc:
                if not is_snapshot_conflict(exc) or cancel.is_set():
                    raise
                if run == SNAPSHOT_CONFLICT_RUNS:
                    raise
                logger.info(
                    "saga %s instance %s: step %r read a snapshot another connection "
                    "changed before its first write; running it again",
                    state.name,
                    state.instance_id,
                    step.name,
                    extra=self._log_extra(state, step.name),
                )


# --------------------------------------------------------------------------- recovery


@dataclass(slots=True)
class RecoveryStats:
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

    def summary(self) -> str:
        return (
            f"claimed {self.claimed}: succeeded {self.succeeded}, compensated "
            f"{self.compensated}, needs attention {self.needs_attention}, released "
            f"{self.released}, lost to another runner {self.lost}, errors {self.errors}; "
            f"claims another runner won first {self.claims_lost}; left untouched "
            f"{self.untouched}"
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
        clock: Callable[[], datetime] = timezone.now,
        on_event: EventCallback | None = None,
        batch_size: int = 20,
        inline: bool | None = None,
    ) -> None:
        self.runner_id = validation.text(
            runner_id or default_runner_id(), "runner id", validation.MAX_OWNER_LENGTH
        )
        self.burst = burst
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
        self.started = threading.Event()

    def stop(self) -> None:
        """Stop claiming; the instance being driven is released after its current step."""
        self.escalate(StopLevel.GRACEFUL)

    def _stop_level_reached(self, level: StopLevel) -> None:
        driver = self._driver
        if driver is None:
            return
        if level >= StopLevel.ABORT:
            driver.abandon()
        elif level >= StopLevel.CANCEL:
            driver.interrupt()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

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
            while not self._stopping.is_set():
                self._wake.clear()
                worked: bool | Failed = False
                if self._release_pending:
                    worked = self.guarded("releasing interrupted instances", self._release_own)
                if worked is not FAILED:
                    worked = self.guarded("looking for saga instances to recover", self.recover_one)
                if worked is FAILED:
                    self._release_pending = True  # a claim may have committed unanswered
                if worked is not FAILED and worked:
                    continue
                if worked is not FAILED and self.burst:
                    break
                self.pause(self.settings.POLL_INTERVAL)
        finally:
            if not self.inline:
                connections[self.alias].close()
        self._emit("stopped", None, self.stats.summary())
        return self.stats

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
            if state is not None and state.leased_by == self.runner_id:
                store.release(state, self.runner_id, now=self.clock())
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
        if final.status is SagaStatus.SUCCEEDED:
            self.stats.succeeded += 1
        elif final.status is SagaStatus.COMPENSATED:
            self.stats.compensated += 1
        elif final.status is SagaStatus.FAILED:
            self.stats.needs_attention += 1
        else:
            self.stats.released += 1
