"""Durable replay: one advance's view of its run's recorded checkpoints.

A body runs from the top at every advance. Each checkpoint it reaches is looked up
under its key (:meth:`Replay.reach`), and the replay rule is written once here
(:func:`recorded`): a finished checkpoint — Succeeded or Failed — returns its
recorded value, or raises its recorded failure, and runs nothing. The first
checkpoint not finished does its work, or records what it waits for and ends the
advance (:class:`Suspend`).

Every write is fenced by the driver's token (:meth:`Replay.write`, on
:func:`workflows.store.guard`): a driver that lost the run records nothing and
stops (:class:`Stop`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import transaction

from ledon.errors import storable_text
from ledon.faults import fault_point

from . import store, validation
from .determinism import RecordedOrder, skipped_detail
from .exceptions import NonDeterministicWorkflow, SignalTimeout, StepFailed
from .types import Checkpoint, DrivenRun, StepKind, StepStatus, Wait, WaitKind


class Suspend(BaseException):
    """The body must wait: the advance ends and the run is WAITING.

    A ``BaseException``, like ``GeneratorExit``: a body's ``except Exception`` must not
    swallow the end of its advance.
    """

    def __init__(self, kind: WaitKind, key: str = "", until: datetime | None = None) -> None:
        #: What the run waits for, stored as it suspends.
        self.wait = Wait(kind=kind, key=key, until=until)
        super().__init__(self.wait.describe())


class Stop(BaseException):
    """The advance stops at once: ``stale`` (another driver holds the run) or the
    run's cancellation was requested."""

    def __init__(self, *, cancelled: bool) -> None:
        self.cancelled = cancelled
        super().__init__("cancelled" if cancelled else "stale driver")


class Recorded:
    """A finished checkpoint's recorded value (a wrapper: the value may be None).

    A slotted class, not a frozen dataclass: a replay makes one per recorded
    checkpoint it passes, and a frozen dataclass's ``__init__`` costs twice as much
    (each field set through ``object.__setattr__``)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def recorded(step: Checkpoint | None) -> Recorded | None:
    """The replay rule: a finished checkpoint returns its recorded value (see
    :func:`outcome`); None for one that is not recorded, or not finished (its
    work, or its wait, is still to do)."""
    if step is None or not step.status.is_finished:
        return None
    return Recorded(outcome(step))


def outcome(step: Checkpoint) -> Any:
    """What a finished checkpoint gives the body, whether a replay finds it recorded
    or this advance has just recorded it: its value, or its recorded failure raised
    (a timed-out signal wait's :class:`SignalTimeout`, any other's
    :class:`StepFailed` naming the error of its last try)."""
    if step.status is StepStatus.FAILED:
        if step.kind is StepKind.SIGNAL:
            raise SignalTimeout(step.key)
        raise StepFailed(step.key, step.error_type, step.error)
    return validation.from_json(step.result_json)


def error_parts(exc: BaseException) -> tuple[str, str]:
    """The type name and message of an error, as a checkpoint records them."""
    return type(exc).__name__, storable_text(str(exc))


class Replay:
    """One advance's replay of a run: its driver and clock, the checkpoints the run
    had recorded when the advance began (kept current as this advance records
    more), which of them the body has reached, and the fenced writes."""

    def __init__(
        self,
        driver: store.Driver,
        clock: Callable[[], datetime],
        steps: store.RecordedSteps | None = None,
        *,
        signal: store.SignalAtTake | None = None,
    ) -> None:
        """``steps``: the run's recorded checkpoints when the caller read them already
        (with the take, or several runs in one query); None reads them. ``signal``:
        the signal the run waited for and its cancel flag, as the take read them
        (the wait for that key reads them from there, once)."""
        self.driver = driver
        self.run: DrivenRun = driver.run
        self.clock = clock
        self._steps = store.load_steps(driver.run.pk) if steps is None else steps
        # A patch marker stands outside the order: a body that no longer asks for its
        # patch skips nothing, and a marker does not make a patch point look passed.
        self._seen: set[str] = set()
        self._order = RecordedOrder(
            self._steps.keys(without=StepKind.PATCH), self._seen, driver.run.rerun_keys
        )
        #: A signal's key and whether it was sent (and its payload), as the reach of
        #: its wait read them with the run's cancellation.
        self._signal_read: tuple[str, tuple[bool, Any]] | None = None
        self._signal_at_take = signal
        #: Set when the body contradicted its recorded checkpoints: the run fails
        #: whatever the body did with the error.
        self.nondeterminism: NonDeterministicWorkflow | None = None

    def reach(self, key: object, kind: StepKind) -> tuple[str, Checkpoint | None]:
        """The body reached checkpoint ``key`` of ``kind``: its checked key and its
        recorded checkpoint, if any. A key used twice, or recorded as another kind,
        or a new key while recorded ones were skipped, is
        :class:`NonDeterministicWorkflow`; a checkpoint with work to do (not
        finished) first checks for the run's cancellation (:class:`Stop`)."""
        checked = validation.key(key)
        if checked in self._seen:
            self._nondeterministic(
                checked, "used twice in one run; every checkpoint needs a key of its own"
            )
        self._seen.add(checked)
        step = self._steps.get(checked)
        if step is not None and step.kind != kind:
            self._nondeterministic(
                checked, f"recorded as a {step.kind} checkpoint, reached now as a {kind}"
            )
        # A recorded checkpoint only returns its value: the cancellation is read at the
        # first one that has work to do or to wait for (one read per checkpoint that
        # counts, none per replayed one).
        finished = step is not None and step.status.is_finished
        if not finished and self.cancelled_at(checked, kind):
            raise Stop(cancelled=True)
        if step is None:
            skipped = self._order.skipped_by(checked)
            if skipped:
                self._nondeterministic(checked, skipped_detail(skipped), skipped)
        if not finished:
            fault_point("workflows.checkpoint.reached", run=self.run.pk, key=checked, kind=kind)
        return checked, step

    def replayed(self, key: object, kind: StepKind) -> Recorded | None:
        """:meth:`reach` and :func:`recorded` at once for a checkpoint recorded
        Succeeded as ``kind``, reached for the first time: its recorded value, making
        nothing of its row but the value (most of a long run's replay). None for any
        other, which takes :meth:`reach`'s path."""
        if type(key) is not str or key in self._seen:
            return None
        result = self._steps.result_of(key, kind)
        if result is None:
            return None
        self._seen.add(key)
        return Recorded(validation.from_json(result))

    def step_of(self, key: str) -> Checkpoint | None:
        """The checkpoint recorded under ``key`` (None if there is none), without
        reaching it."""
        return self._steps.get(key)

    def beyond(self) -> bool:
        """Whether the run had recorded checkpoints that this replay has not reached
        yet (see :meth:`~workflows.determinism.RecordedOrder.beyond`)."""
        return self._order.beyond()

    def ahead(self) -> tuple[str, ...]:
        """The recorded checkpoints this replay has not reached yet, in the order
        recorded."""
        return self._order.ahead()

    def _nondeterministic(self, key: str, detail: str, skipped: tuple[str, ...] = ()) -> None:
        error = NonDeterministicWorkflow(key, detail, skipped)
        if self.nondeterminism is None:
            self.nondeterminism = error
        raise error

    def cancel_requested(self) -> bool:
        return store.cancel_requested(self.run.pk)

    def cancelled_at(self, key: str, kind: StepKind) -> bool:
        """Whether the run's cancel was requested, read as checkpoint ``key`` of
        ``kind`` is reached with work to do. A signal's wait reads whether its signal
        came in the same statement (see :meth:`signal_sent`)."""
        # The take's read serves the first checkpoint with work to do, if it is the
        # wait for that signal; any other reads its own.
        taken, self._signal_at_take = self._signal_at_take, None
        if kind is not StepKind.SIGNAL:
            return self.cancel_requested()
        if taken is not None and taken.key == key:
            payload = taken.payload_json
            self._signal_read = (key, (payload is not None, validation.from_json(payload)))
            return taken.cancelled
        cancelled, sent = store.cancel_and_signal(self.run.pk, key)
        self._signal_read = (key, sent)
        return cancelled

    def signal_sent(self, key: str) -> tuple[bool, Any]:
        """Whether signal ``key`` was sent to the run, and its payload: as the reach
        of its wait read it, else read now."""
        read, self._signal_read = self._signal_read, None
        if read is not None and read[0] == key:
            return read[1]
        return store.signal_payload(self.run.pk, key)

    def now(self) -> datetime:
        return self.clock()

    def write(self, *, unflushed: bool = False) -> Fenced:
        """A fenced transaction for this driver (:class:`Stop` if it is stale);
        ``unflushed``: one whose commit need not wait for the disk (see
        :func:`workflows.store.commit_unflushed`)."""
        return Fenced(self.driver, self.now(), unflushed=unflushed)

    def fence(self, now: datetime) -> None:
        """Touch the run row as its driver, inside the caller's transaction
        (:class:`Stop` if this driver is stale)."""
        _fence(self.driver, now)

    def record(self, step: Checkpoint) -> Checkpoint:
        """Keep ``step`` as this replay's picture of it (written and committed)."""
        self._steps.put(step)
        return step

    def insert(
        self, key: str, kind: StepKind, status: StepStatus, now: datetime, **fields: Any
    ) -> Checkpoint:
        """Record a new checkpoint (inside a fenced transaction)."""
        return store.insert_step(self.driver, key, kind, status, now, **fields)

    def move(self, step: Checkpoint, expected: StepStatus, **fields: Any) -> Checkpoint:
        """Move ``step`` from ``expected`` (inside a fenced transaction) and return it
        as it now stands. :class:`Stop` if it is not there any more: a cancel of the
        run marked it Cancelled (the advance then ends the run Cancelled), or another
        driver moved it."""
        moved = store.update_step(step, expected, **fields)
        if moved is None:
            raise Stop(cancelled=False)
        return moved

    def settle(
        self,
        key: str,
        step: Checkpoint | None,
        kind: StepKind,
        status: StepStatus,
        now: datetime,
        **fields: Any,
    ) -> Checkpoint:
        """Record ``key``'s checkpoint as ``status`` (inside a fenced transaction): a
        new one, or ``step`` moved on from where it stands (see :meth:`move`)."""
        if step is None:
            return self.insert(key, kind, status, now, **fields)
        finished = now if status.is_finished else None
        return self.move(step, step.status, status=status, finished_at=finished, **fields)

    def settle_alone(
        self,
        key: str,
        step: Checkpoint | None,
        kind: StepKind,
        status: StepStatus,
        now: datetime,
        *,
        flushed: bool = True,
        **fields: Any,
    ) -> Checkpoint:
        """:meth:`settle` for a write that is this checkpoint's and nothing else: one
        statement that carries the fence (:func:`workflows.store.record_step`, where
        ``flushed`` is explained), its own transaction unless the caller has one open.
        :class:`Stop` if the driver is stale or ``step`` is not where it stood (see
        :meth:`move`)."""
        settled = store.record_step(
            self.driver, step, key, kind, status, now, flushed=flushed, **fields
        )
        if settled is None:
            raise Stop(cancelled=False)
        return settled

    def wake_at(self, when: datetime, reason: str, detail: str, now: datetime) -> None:
        """Stage the advance job that wakes this run at ``when`` (inside a fenced
        transaction; see :func:`workflows.store.wake`)."""
        store.wake(self.run.pk, self.run.generation, reason, detail, not_before=when, now=now)


class Fenced:
    """``with replay.write():`` — a transaction fenced by :func:`workflows.store.guard`
    first, a stale driver turned into :class:`Stop`."""

    def __init__(self, driver: store.Driver, now: datetime, *, unflushed: bool = False) -> None:
        self._atomic = transaction.atomic(using=store.alias())
        self._driver = driver
        self._now = now
        self._unflushed = unflushed

    def __enter__(self) -> None:
        self._atomic.__enter__()
        try:
            _fence(self._driver, self._now)
            if self._unflushed:
                store.commit_unflushed()
        except BaseException as exc:
            self._atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __exit__(self, *exc_info: Any) -> None:
        self._atomic.__exit__(*exc_info)


def _fence(driver: store.Driver, now: datetime) -> None:
    try:
        store.guard(driver, now)
    except store.StaleDriver:
        raise Stop(cancelled=False) from None
