"""``WorkflowContext``: what a workflow body receives, and durable replay.

The body runs from the top at every advance. Each checkpoint method takes an
explicit key: a checkpoint recorded under that key returns its recorded value (or
raises its recorded error) without running anything; the first one not recorded
does its work — or records what it waits for — and, if it must wait, ends the
advance (the run is WAITING) without holding a worker slot.

Every write is fenced by the driver's token (:func:`workflows.store.guard`): a
driver that lost the run records nothing. An inline step's function runs inside the
transaction that records its checkpoint, so its writes to the default database and
its checkpoint commit together or not at all.

Fault points offered here (``ledon.faults``), for crash and race tests:
``workflows.checkpoint.reached`` (a checkpoint with work to do reached, its cancel
check passed, nothing written yet; outside any transaction),
``workflows.step.before_checkpoint`` (a step's work done, its checkpoint not yet
committed), ``workflows.step.after_checkpoint``, ``workflows.timer.wake`` (a timer's
checkpoint about to commit as fired). The engine offers ``workflows.advance.suspend``
(an advance about to wait; outside any transaction). The store offers
``workflows.map.fan_in`` (an item's end about to be written),
``workflows.map.item_ended`` (written, its run not yet woken),
``workflows.signal.deliver``, ``workflows.take.refused`` (an advance job refused a
Running run, the wake-up it leaves not yet noted) and
``workflows.cancel.not_waiting`` (a cancel found the run not Waiting, its request not
yet written); the item jobs ``workflows.item.before_record``.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, transaction

from ledon.clock import aware_utc
from ledon.errors import storable_text
from ledon.faults import fault_point
from ledon.tracing import AttributeValue

from . import registry, store, validation
from .conf import workflows_settings
from .determinism import RecordedOrder, skipped_detail
from .exceptions import (
    InvalidInput,
    NonDeterministicWorkflow,
    SignalTimeout,
    StepFailed,
)
from .observability import hooks
from .types import Checkpoint, RunStatus, StepKind, StepStatus


class Suspend(BaseException):
    """The body must wait: the advance ends and the run is WAITING.

    A ``BaseException``, like ``GeneratorExit``: a body's ``except Exception`` must not
    swallow the end of its advance.
    """

    def __init__(self, waiting_for: str, wake_at: datetime | None = None) -> None:
        self.waiting_for = waiting_for
        self.wake_at = wake_at
        super().__init__(waiting_for)


class Stop(BaseException):
    """The advance stops at once: ``stale`` (another driver holds the run) or the
    run's cancellation was requested."""

    def __init__(self, *, cancelled: bool) -> None:
        self.cancelled = cancelled
        super().__init__("cancelled" if cancelled else "stale driver")


def retry_delay(tries: int) -> float:
    """Seconds before the next try of a step that failed ``tries`` times."""
    settings = workflows_settings()
    return float(min(settings.STEP_RETRY_MAX_DELAY, settings.STEP_RETRY_DELAY * 2 ** (tries - 1)))


def error_parts(exc: BaseException) -> tuple[str, str]:
    """The type name and message of an error, as a step records them."""
    return type(exc).__name__, storable_text(str(exc))


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat()


_activity_context = threading.local()


def current_activity() -> Any:
    """The ``jobs.JobContext`` of the activity try running in this thread (its
    ``cancel_requested`` turns true when the run is cancelled), or None."""
    return getattr(_activity_context, "ctx", None)


def _checkpoint[**P, R](method: Callable[P, R]) -> Callable[P, R]:
    """A checkpoint method: an error it raises (bad arguments, a child's identity
    conflict) is remembered with the checkpoint's key, so that a run it fails names
    that checkpoint as its failed step."""

    @functools.wraps(method)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            ctx: WorkflowContext = args[0]  # type: ignore[assignment]
            key = args[1] if len(args) > 1 else kwargs.get("key")
            if ctx._raised is None or ctx._raised[0] is not exc:
                # A key that is not valid (too long, a NUL…) is what the error is
                # about; it names no checkpoint and cannot be stored as one.
                ctx._raised = (exc, key if isinstance(key, str) and validation.is_key(key) else "")
            raise

    return call


class WorkflowContext:
    """What a workflow body receives: its input, its run id, and checkpoints.

    Every checkpoint has an explicit key, unique in the run (validated like a job
    id). Bodies must be deterministic given their recorded checkpoints: use
    :meth:`now` for the time and :meth:`idempotency_key` for outside services.
    """

    def __init__(self, driver: store.Driver, clock: Callable[[], datetime]) -> None:
        self._driver = driver
        self._run = driver.run
        self._clock = clock
        self._steps: dict[str, Checkpoint] = store.load_steps(driver.run.pk)
        self._order = RecordedOrder(self._steps, driver.run.rerun_keys)
        self._seen: set[str] = set()
        self._deadline: float | None = None
        #: Set when the body contradicted its recorded checkpoints: the run fails
        #: whatever the body did with the error.
        self.nondeterminism: NonDeterministicWorkflow | None = None
        #: The last error a checkpoint raised, with its key (see
        #: :meth:`checkpoint_of`).
        self._raised: tuple[BaseException, str] | None = None
        #: The run's input (parsed JSON).
        self.input: Any = validation.from_json(driver.run.input_json)

    # identity
    @property
    def run_id(self) -> str:
        return self._run.run_id

    @property
    def scope_hash(self) -> str:
        return self._run.scope_hash

    @property
    def name(self) -> str:
        return self._run.name

    @property
    def version(self) -> int:
        return self._run.version

    @property
    def cancel_requested(self) -> bool:
        """True once the run's cancellation is requested (or an inline step runs past
        its ``timeout``): a long inline step polls it to stop early."""
        if self._deadline is not None and time.monotonic() > self._deadline:
            return True
        return store.cancel_requested(self._run.pk)

    def idempotency_key(self, key: str) -> str:
        """A stable string for outside services, the same at every replay and try of
        the step ``key`` of this run (and different for every other run and key)."""
        key = validation.key(key)
        text = "\x00".join((self._run.scope_hash, self._run.run_id, key))
        return "wf-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:40]

    def checkpoint_of(self, exc: BaseException) -> str:
        """The key of the checkpoint that raised ``exc`` ("" if the body raised it
        itself, or caught a checkpoint's error and raised another)."""
        if self._raised is not None and self._raised[0] is exc:
            return self._raised[1]
        return ""

    # replay bookkeeping
    def _reach(self, key: object, kind: StepKind) -> tuple[str, Checkpoint | None]:
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
        finished = step is not None and step.status in (StepStatus.SUCCEEDED, StepStatus.FAILED)
        if not finished and store.cancel_requested(self._run.pk):
            raise Stop(cancelled=True)
        if step is None:
            skipped = self._order.skipped_by(checked)
            if skipped:
                self._nondeterministic(checked, skipped_detail(skipped), skipped)
        else:
            self._order.reached(checked)
        if not finished:
            fault_point("workflows.checkpoint.reached", run=self._run.pk, key=checked, kind=kind)
        return checked, step

    def _nondeterministic(self, key: str, detail: str, skipped: tuple[str, ...] = ()) -> None:
        error = NonDeterministicWorkflow(key, detail, skipped)
        if self.nondeterminism is None:
            self.nondeterminism = error
        raise error

    def _now(self) -> datetime:
        return self._clock()

    def _write(self) -> Any:
        """A fenced transaction for this driver (:class:`Stop` if it is stale)."""
        return _Fenced(self._driver, self._now())

    def _record(self, step: Checkpoint) -> Checkpoint:
        self._steps[step.key] = step
        return step

    def _move(self, step: Checkpoint, expected: StepStatus, **fields: Any) -> Checkpoint:
        """Move ``step`` from ``expected`` (inside a fenced transaction) and return it
        as it now stands. :class:`Stop` if it is not there any more: a cancel of the
        run marked it Cancelled (the advance then ends the run Cancelled), or another
        driver moved it."""
        moved = store.update_step(step, expected, **fields)
        if moved is None:
            raise Stop(cancelled=False)
        return moved

    def _wake_at(self, when: datetime, reason: str, detail: str, now: datetime) -> None:
        """Stage the advance job that wakes this run at ``when`` (inside a fenced
        transaction; see :func:`store.wake`)."""
        store.wake(self._run.pk, self._run.generation, reason, detail, not_before=when, now=now)

    def _settle(
        self,
        key: str,
        step: Checkpoint | None,
        kind: StepKind,
        status: StepStatus,
        now: datetime,
        **fields: Any,
    ) -> Checkpoint:
        """Record ``key``'s checkpoint as ``status`` (inside a fenced transaction): a
        new one, or ``step`` moved on from where it stands (see :meth:`_move`)."""
        if step is None:
            return store.insert_step(self._driver, key, kind, status, now, **fields)
        finished = now if status in (StepStatus.SUCCEEDED, StepStatus.FAILED) else None
        return self._move(step, step.status, status=status, finished_at=finished, **fields)

    # checkpoints
    @_checkpoint
    def step(
        self,
        key: str,
        fn: Callable[..., Any] | str,
        *args: Any,
        retries: int = 0,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once and record its JSON result under ``key``.

        A plain function runs here, in this worker, inside the transaction that
        records its result (its writes and its checkpoint commit together). A failed
        try rolls back its writes; the run waits (no slot held) and tries again with
        back-off, ``retries`` times; then :class:`StepFailed` is raised here.
        ``timeout``: a try running longer is rolled back and counts as failed
        (``wf.cancel_requested`` turns true at that time, for the step to stop).
        An ``@activity`` (the function, or its registered name as a string) runs
        instead as one job on any worker (its own retries, timeout and queue apply)
        and this returns its result.
        """
        spec = registry.get_activity(fn) if isinstance(fn, str) else registry.activity_of(fn)
        if spec is not None or isinstance(fn, str):
            assert spec is not None  # get_activity raises for an unknown name
            if retries != 0 or timeout is not None:
                # An activity's job runs with the activity's own options: these
                # would be dropped without a word.
                raise InvalidInput(
                    f"step {key!r}: {spec.name!r} is an @activity, whose retries and "
                    "timeout are set on @activity(...), not on wf.step()"
                )
            payload = {"args": list(args), "kwargs": kwargs}
            return self._activities(key, StepKind.ACTIVITY, spec, [payload])[0]
        checked, step = self._reach(key, StepKind.STEP)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 100:
            raise InvalidInput(f"step {checked!r}: retries must be an int in [0, 100]")
        if timeout is not None:
            timeout = validation.seconds(timeout, f"step {checked!r}: timeout")
        if step is not None:
            if step.status == StepStatus.SUCCEEDED:
                return validation.from_json(step.result_json)
            if step.status == StepStatus.FAILED:
                raise StepFailed(checked, step.error_type, step.error)
            if step.wake_at is not None and self._now() < step.wake_at:
                raise Suspend(f"retry of {checked} at {_iso(step.wake_at)}", step.wake_at)
        # Checked before every try, as an activity's are when its job is staged.
        validation.to_json(
            {"args": list(args), "kwargs": kwargs}, f"the arguments of step {checked!r}"
        )
        tries = (step.attempts if step is not None else 0) + 1
        return self._try_inline(checked, step, tries, fn, args, kwargs, retries, timeout)

    def _try_inline(
        self,
        key: str,
        step: Checkpoint | None,
        tries: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retries: int,
        timeout: float | None,
    ) -> Any:
        started = time.monotonic()
        self._deadline = None if timeout is None else started + timeout
        attributes: dict[str, AttributeValue] = {"workflow.step": key, "workflow.try": tries}
        recording = False
        try:
            with (
                hooks.workflows_tracer().span("workflow.step", attributes=attributes),
                transaction.atomic(using=store.alias()),
            ):
                value = fn(*args, **kwargs)
                result_json = validation.to_json(value, f"the result of step {key!r}")
                if timeout is not None and time.monotonic() - started > timeout:
                    raise TimeoutError(f"step {key!r} ran longer than its timeout of {timeout:g} s")
                recording = True
                fault_point("workflows.step.before_checkpoint", run=self._run.pk, key=key)
                now = self._now()
                # The fence last: the run row stays unlocked while the step works.
                _guard(self._driver, now)
                step = self._settle(
                    key,
                    step,
                    StepKind.STEP,
                    StepStatus.SUCCEEDED,
                    now,
                    attempts=tries,
                    result_json=result_json,
                    wake_at=None,
                )
        except (Stop, Suspend):
            raise
        except (OperationalError, InterfaceError):
            # The connection failed (an outage, or a COMMIT whose reply was lost: it
            # may have committed): not the step's fault. The advance fails and is
            # tried again; its replay finds the checkpoint recorded, or runs the try
            # again if it was not.
            raise
        except Exception as exc:
            if recording and isinstance(exc, DatabaseError):
                raise  # the fence or the checkpoint's own write: the same
            # The step's own error (its writes rolled back with it): a failed try.
            self._deadline = None
            self._step_ended(StepKind.STEP, "failed", started)
            return self._failed_try(key, step, tries, retries, exc)
        finally:
            self._deadline = None
        self._step_ended(StepKind.STEP, "succeeded", started)
        self._record(step)
        fault_point("workflows.step.after_checkpoint", run=self._run.pk, key=key)
        return validation.from_json(result_json)

    def _step_ended(self, kind: StepKind, outcome: str, started: float) -> None:
        hooks.step_ended(self._run.name, kind.value, outcome, time.monotonic() - started)

    def _failed_try(
        self, key: str, step: Checkpoint | None, tries: int, retries: int, exc: Exception
    ) -> Any:
        error_type, message = error_parts(exc)
        now = self._now()
        retry_at = now + timedelta(seconds=retry_delay(tries)) if tries <= retries else None
        status = StepStatus.WAITING if retry_at is not None else StepStatus.FAILED
        fields: dict[str, Any] = {
            "attempts": tries,
            "error_type": error_type[:200],
            "error": message,
            "wake_at": retry_at,
        }
        with self._write():
            step = self._settle(key, step, StepKind.STEP, status, now, **fields)
            if retry_at is not None:
                self._wake_at(retry_at, "retry", f"{key}:{tries}", now)
        self._record(step)
        if retry_at is not None:
            raise Suspend(f"retry of {key} at {_iso(retry_at)}", retry_at)
        raise StepFailed(key, error_type, message)

    @_checkpoint
    def map(self, key: str, fn: Callable[..., Any] | str, items: Iterable[Any]) -> list[Any]:
        """Run the activity ``fn`` (or the activity of that name) once per item, each
        as its own job on any worker (in parallel, under the activity's limits), and
        return the results in the items' order. The run waits without a slot and
        resumes once, when the last item ends; if items failed after their retries,
        :class:`StepFailed` is raised then.
        """
        spec = registry.get_activity(fn) if isinstance(fn, str) else registry.activity_of(fn)
        if spec is None:
            raise InvalidInput(
                f"map {key!r}: {getattr(fn, '__name__', fn)!r} is not an @activity; "
                "only activities run as jobs"
            )
        if isinstance(items, str | bytes | dict) or not isinstance(items, Iterable):
            raise InvalidInput(f"map {key!r}: items must be a list of JSON values")
        if isinstance(items, set | frozenset):
            # Results come back in the items' order, and a set has none that a replay
            # would see again.
            raise InvalidInput(f"map {key!r}: items must be ordered (a list), not a set")
        payloads = [{"args": [item], "kwargs": {}} for item in items]
        return self._activities(key, StepKind.MAP, spec, payloads)

    def _activities(
        self, key: str, kind: StepKind, spec: registry.ActivitySpec, payloads: list[Any]
    ) -> list[Any]:
        checked, step = self._reach(key, kind)
        if step is None:
            store.check_item_count(checked, len(payloads))
            args = self._item_args(checked, kind, payloads)
            now = self._now()
            with self._write():
                done = not args
                step = store.insert_step(
                    self._driver,
                    checked,
                    kind,
                    StepStatus.SUCCEEDED if done else StepStatus.RUNNING,
                    now,
                    item_count=len(args),
                    result_json="[]" if done else None,
                )
                if not done:
                    store.insert_items(self._run, step, spec, args[: store.ITEM_BATCH])
            self._record(step)
            if done:
                return []
            self._queue_items(step, spec, args, queued=min(len(args), store.ITEM_BATCH))
            raise Suspend(f"0 of {len(args)} items")
        if step.status == StepStatus.SUCCEEDED:
            result = validation.from_json(step.result_json)
            return result if kind == StepKind.MAP else [result]
        if step.status == StepStatus.FAILED:
            raise StepFailed(checked, step.error_type, step.error)
        if step.status == StepStatus.RUNNING and store.items_queued(step) < step.item_count:
            # The driver that queued the items stopped between two batches.
            self._queue_items(step, spec, self._item_args(checked, kind, payloads))
        left = store.items_left(step)
        if left > 0:
            raise Suspend(f"{step.item_count - left} of {step.item_count} items")
        return self._fan_in(checked, kind, step)

    @staticmethod
    def _item_args(key: str, kind: StepKind, payloads: list[Any]) -> list[str]:
        return [
            validation.to_json(payload, f"the arguments of {kind} {key!r} item {index}")
            for index, payload in enumerate(payloads)
        ]

    def _queue_items(
        self,
        step: Checkpoint,
        spec: registry.ActivitySpec,
        args: list[str],
        queued: int | None = None,
    ) -> None:
        """Queue the items (and their jobs) not queued yet (the first ``queued``
        are; None: ask), :data:`store.ITEM_BATCH` per fenced transaction: a large
        map never holds the write lock long."""
        if queued is None:
            queued = store.items_queued(step)
        while queued < len(args):
            batch = args[queued : queued + store.ITEM_BATCH]
            store.let_writers_in()
            with self._write():
                store.insert_items(self._run, step, spec, batch, start=queued)
            queued += len(batch)

    def _fan_in(self, key: str, kind: StepKind, step: Checkpoint) -> list[Any]:
        items = store.items_of(step)
        failed = [item for item in items if item.status != StepStatus.SUCCEEDED]
        now = self._now()
        with self._write():
            if failed:
                first = failed[0]
                error_type = first.error_type or "Cancelled"
                message = first.error or f"item {first.index} was {first.status}"
                if len(items) > 1:
                    message = (
                        f"{len(failed)} of {len(items)} items failed; item {first.index}: {message}"
                    )
                step = self._move(
                    step,
                    StepStatus.RUNNING,
                    status=StepStatus.FAILED,
                    error_type=error_type[:200],
                    error=storable_text(message),
                    attempts=max(item.attempts for item in items),
                    finished_at=now,
                )
            else:
                results = [validation.from_json(item.result_json) for item in items]
                value = results if kind == StepKind.MAP else results[0]
                step = self._move(
                    step,
                    StepStatus.RUNNING,
                    status=StepStatus.SUCCEEDED,
                    result_json=validation.to_json(value, f"the result of {kind} {key!r}"),
                    attempts=max(item.attempts for item in items),
                    finished_at=now,
                )
        self._record(step)
        if failed:
            raise StepFailed(key, step.error_type, step.error)
        return results

    @_checkpoint
    def sleep(self, key: str, seconds: float) -> None:
        """Wait ``seconds`` durably: no slot is held, and the run resumes no earlier
        than the time recorded when the sleep was first reached."""
        wait = validation.seconds(seconds, f"sleep {key!r}: seconds", zero=True)
        self._timer(key, lambda now: now + timedelta(seconds=wait))

    @_checkpoint
    def sleep_until(self, key: str, when: datetime) -> None:
        """Wait durably until ``when`` (an aware datetime)."""
        at = aware_utc(when, f"sleep_until {key!r}: when", error=InvalidInput)
        self._timer(key, lambda now: at)

    def _timer(self, key: str, wake_time: Callable[[datetime], datetime]) -> None:
        checked, step = self._reach(key, StepKind.SLEEP)
        if step is not None and step.status == StepStatus.SUCCEEDED:
            return
        now = self._now()
        if step is None:
            wake_at = wake_time(now)
            with self._write():
                status = StepStatus.SUCCEEDED if wake_at <= now else StepStatus.WAITING
                step = store.insert_step(
                    self._driver, checked, StepKind.SLEEP, status, now, wake_at=wake_at
                )
                if status == StepStatus.WAITING:
                    self._wake_at(wake_at, "timer", checked, now)
            self._record(step)
            if status == StepStatus.SUCCEEDED:
                return
            raise Suspend(f"timer until {_iso(wake_at)}", wake_at)
        assert step.wake_at is not None
        if now < step.wake_at:
            # Woken early (another reason, or a clock behind the job's): wait again.
            with self._write():
                self._wake_at(step.wake_at, "timer", f"{checked}@{self._run.advances}", now)
            raise Suspend(f"timer until {_iso(step.wake_at)}", step.wake_at)
        with self._write():
            fault_point("workflows.timer.wake", run=self._run.pk, key=checked)
            step = self._move(
                step, StepStatus.WAITING, status=StepStatus.SUCCEEDED, finished_at=now
            )
        self._record(step)

    @_checkpoint
    def wait_for_signal(self, key: str, timeout: float | None = None) -> Any:
        """The payload of the signal ``key`` sent to this run (``send_signal``); waits
        without a slot until it arrives. A signal sent before the wait is reached is
        kept. After ``timeout`` seconds without it, :class:`SignalTimeout` is raised."""
        wait = (
            None
            if timeout is None
            else validation.seconds(timeout, f"wait_for_signal {key!r}: timeout")
        )
        checked, step = self._reach(key, StepKind.SIGNAL)
        if step is not None:
            if step.status == StepStatus.SUCCEEDED:
                return validation.from_json(step.result_json)
            if step.status == StepStatus.FAILED:
                raise SignalTimeout(checked)
        now = self._now()
        arrived, payload = store.signal_payload(self._run.pk, checked)
        with self._write():
            if arrived:
                result_json = validation.to_json(payload, f"signal {checked!r}")
                if step is None:
                    step = store.insert_step(
                        self._driver,
                        checked,
                        StepKind.SIGNAL,
                        StepStatus.SUCCEEDED,
                        now,
                        result_json=result_json,
                    )
                else:
                    step = self._move(
                        step,
                        StepStatus.WAITING,
                        status=StepStatus.SUCCEEDED,
                        result_json=result_json,
                        finished_at=now,
                    )
            elif step is None:
                deadline = None if wait is None else now + timedelta(seconds=wait)
                step = store.insert_step(
                    self._driver,
                    checked,
                    StepKind.SIGNAL,
                    StepStatus.WAITING,
                    now,
                    wake_at=deadline,
                )
                if deadline is not None:
                    self._wake_at(deadline, "signal-timeout", checked, now)
            elif step.wake_at is not None and now >= step.wake_at:
                step = self._move(
                    step,
                    StepStatus.WAITING,
                    status=StepStatus.FAILED,
                    error_type="SignalTimeout",
                    error=str(SignalTimeout(checked)),
                    finished_at=now,
                )
        self._record(step)
        if step.status == StepStatus.SUCCEEDED:
            return payload
        if step.status == StepStatus.FAILED:
            raise SignalTimeout(checked)
        raise Suspend(store.signal_wait(checked), step.wake_at)

    @_checkpoint
    def child(self, key: str, name: str, input: Any = None, *, version: int | None = None) -> Any:
        """Start the child run ``"{run_id}/{key}"`` of workflow ``name`` in this run's
        scope, wait for it without a slot and return its output; a child that fails
        (or is cancelled) raises :class:`StepFailed`."""
        checked, step = self._reach(key, StepKind.CHILD)
        if step is None:
            spec = registry.get_workflow(name, version)
            input_json = validation.to_json(input, f"the input of child {checked!r}")
            now = self._now()
            with self._write():
                child = store.create_child(
                    self._run, checked, spec.name, spec.version, input_json, now
                )
                step = store.insert_step(
                    self._driver,
                    checked,
                    StepKind.CHILD,
                    StepStatus.WAITING,
                    now,
                    child_id=child.pk,
                )
            self._record(step)
            if child.status in RunStatus.unfinished():
                raise Suspend(f"child {checked}")
            # The child had ended already (a resumed parent finds the run it started
            # before): nothing would wake this run for it, so its end is read now.
        if step.status == StepStatus.SUCCEEDED:
            return validation.from_json(step.result_json)
        if step.status == StepStatus.FAILED:
            raise StepFailed(checked, step.error_type, step.error)
        child_run = store.child_run(step)
        if child_run is None or child_run.status not in RunStatus.finished():
            raise Suspend(f"child {checked}")
        now = self._now()
        succeeded = child_run.status == RunStatus.SUCCEEDED
        with self._write():
            if succeeded:
                step = self._move(
                    step,
                    StepStatus.WAITING,
                    status=StepStatus.SUCCEEDED,
                    result_json=child_run.output_json,
                    finished_at=now,
                )
            else:
                error_type, _, message = (child_run.error or "").partition(": ")
                step = self._move(
                    step,
                    StepStatus.WAITING,
                    status=StepStatus.FAILED,
                    error_type=(error_type if message else "ChildRunFailed")[:200]
                    if child_run.status == RunStatus.FAILED
                    else "ChildRunCancelled",
                    error=storable_text(
                        message.split("\n\n", 1)[0]
                        if message
                        else f"child run {child_run.run_id!r} ended {child_run.status}"
                    ),
                    finished_at=now,
                )
        self._record(step)
        if not succeeded:
            raise StepFailed(checked, step.error_type, step.error)
        return validation.from_json(step.result_json)

    @_checkpoint
    def now(self, key: str) -> datetime:
        """The current time, recorded under ``key``: every replay returns the same."""
        checked, step = self._reach(key, StepKind.NOW)
        if step is not None:
            return datetime.fromisoformat(validation.from_json(step.result_json))
        now = self._now()
        with self._write():
            step = store.insert_step(
                self._driver,
                checked,
                StepKind.NOW,
                StepStatus.SUCCEEDED,
                now,
                result_json=validation.to_json(_iso(now), "now"),
            )
        self._record(step)
        return now.astimezone(UTC)


def _guard(driver: store.Driver, now: datetime) -> None:
    try:
        store.guard(driver, now)
    except store.StaleDriver:
        raise Stop(cancelled=False) from None


class _Fenced:
    """``with ctx._write():`` — a transaction fenced by :func:`workflows.store.guard`
    first, a stale driver turned into :class:`Stop`."""

    def __init__(self, driver: store.Driver, now: datetime) -> None:
        self._atomic = transaction.atomic(using=store.alias())
        self._driver = driver
        self._now = now

    def __enter__(self) -> None:
        self._atomic.__enter__()
        try:
            _guard(self._driver, self._now)
        except BaseException as exc:
            self._atomic.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __exit__(self, *exc_info: Any) -> None:
        self._atomic.__exit__(*exc_info)
