"""The driver: runs one leased saga instance to its end, step after step.

``run_saga``, ``resume_saga`` and ``compensate_saga`` drive an instance in the calling
process; the recovery engine (:class:`~sagas.runner.SagaRunner`, ``recover_sagas``)
drives each instance it claims the same way.

Each step runs on a step thread (:mod:`sagas.steps`), in a transaction of its own
(:class:`~sagas.db.StepAtomic`) with its own unit of work; its completion mark —
completed step, data, version + 1, guarded by the version the step started from and
by the lease holder — is written in that same transaction. A step that outlives its
timeout gets its cancellation signal; if it does not stop within
``SAGAS["CANCEL_GRACE_SECONDS"]`` the driver stops waiting, treats the step as failed
and starts compensating. Starting compensation moves the version on, so whatever the
late step does afterwards, its transaction can no longer commit its completion.

While it drives an instance, a lease keeper (:mod:`sagas.lease`) renews the
instance's lease from a thread of its own; the version is not moved by renewals, so
they never fence the running step. A step that ends on an unreachable database has
not failed: the driver raises the database error (its caller releases the instance)
and the step runs again once the database is back; nothing is compensated for an
outage.

Fault points (see :mod:`ledon.faults`), for crash tests:

``sagas.step.started``
    a step's transaction is open; its action is about to run (``step``, ``instance_id``).
``sagas.step.marked``
    the step's action returned and its completion mark is written, not committed.
``sagas.step.committed``
    the step's transaction, completion mark included, is committed.
``sagas.compensation.marked`` / ``sagas.compensation.committed``
    the same for a compensation.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import socket
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any

from django.db import DatabaseError

from ledon.backoff import retry_delay
from ledon.clock import now as database_now
from ledon.db import TRANSIENT_ERRORS, alias_for
from ledon.errors import format_error
from ledon.faults import fault_point
from outbox import unit_of_work

from . import store, validation
from .conf import sagas_settings
from .context import SagaContext
from .db import StepAtomic, is_snapshot_conflict
from .exceptions import (
    InvalidTransition,
    SagaConcurrencyError,
    SagaLeaseLost,
    StepKeptDying,
)
from .lease import DatabaseErrorReport, LeaseKeeper
from .models import SagaInstance
from .observability.hooks import FINISHING_EVENTS, instance_finished, step_span, trace_context
from .registry import SagaDefinition, SagaStep
from .steps import StepOutcome, TimedStep, step_thread_for_caller
from .types import SagaSnapshot, SagaStatus

logger = logging.getLogger(__name__)

#: A callback for what a driver (or the recovery runner) does: (event, instance or
#: None, detail).
EventCallback = Callable[[str, SagaSnapshot | None, str], None]

#: Runs of one step after SQLite refused to upgrade its read snapshot to a write.
SNAPSHOT_CONFLICT_RUNS = 5


def default_runner_id() -> str:
    """``host:pid:random`` — unique for every driver, so two never share a lease."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(eq=False)
class Driver:
    """Drive one instance, leased to ``owner``, until it ends, the lease is lost, or
    ``stopping`` is set (then the lease is released between two steps).

    ``inline`` is for code running inside a test case's transaction, which other
    connections cannot see: each step's thread then borrows the caller's connection.
    ``on_database_error`` reports the lease keeper's database errors (default: log
    each). :meth:`interrupt` and :meth:`abandon` are for a runner that shuts down.
    """

    definition: SagaDefinition
    owner: str
    _: KW_ONLY
    clock: Callable[[], datetime] = database_now
    on_event: EventCallback | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    inline: bool = False
    on_database_error: DatabaseErrorReport | None = None

    def __post_init__(self) -> None:
        self.settings = sagas_settings()
        self.alias = alias_for(SagaInstance)
        #: The exception of the step that failed while this driver ran it, if any.
        self.failure: BaseException | None = None
        #: The last exception of a compensation that kept failing, if any.
        self.compensation_failure: BaseException | None = None
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
    def _raise_if_the_database_failed(outcome: StepOutcome) -> None:
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
        keeper: LeaseKeeper | None = None
        if not self.inline:
            keeper = LeaseKeeper(
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
                step_thread_for_caller().tidy()

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
        error = format_error(outcome.error)
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
                delay = retry_delay(
                    attempt,
                    base=self.settings.COMPENSATION_RETRY_DELAY,
                    factor=2,
                    cap=math.inf,
                    jitter=0,
                )
                if self.stopping.wait(delay) or self._lost.is_set():
                    return  # the loop releases the lease or notices the takeover
        assert last is not None
        self.compensation_failure = last
        message = (
            f"compensation of step {step.name!r} failed {attempts} time(s); the last "
            f"error:\n{format_error(last)}"
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
    ) -> StepOutcome:
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

        timeout = step.timeout if step.timeout is not None else self.settings.STEP_TIMEOUT

        def timed_out() -> None:
            self._emit(
                "step-timeout", state, f"{step.name} after {timeout}s; cancellation signalled"
            )

        timed = TimedStep(
            body=body,
            label=f"step {step.name!r} of saga {state.name!r}",
            thread_name=f"saga-step-{state.name}-{step.name}",
            timeout=timeout,
            grace=self.settings.CANCEL_GRACE_SECONDS,
            cancel=cancel,
            abandoned=self._abandoned,
            on_timeout=timed_out,
            log_extra=self._log_extra(state, step.name),
        )
        try:
            return timed.run(borrow=self.alias if self.inline else None)
        finally:
            self._current_cancel = None

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
