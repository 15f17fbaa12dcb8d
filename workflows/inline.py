"""Inline steps: a plain function run in this worker, inside the transaction that
records its checkpoint, so that its writes to the default database and its
checkpoint commit together or not at all.

A failed try rolls back its writes and is recorded (its error, when the next try is
due); the run then waits without a slot and tries again with back-off, as many
times as the step's ``retries``; the last failure is recorded as the step's.
Offers the fault points ``workflows.step.before_checkpoint`` (the step's work done,
its checkpoint not yet committed) and ``workflows.step.after_checkpoint``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from ledon.faults import fault_point
from ledon.tracing import AttributeValue

from . import store, validation
from .conf import retry_pace
from .observability import hooks
from .replay import Replay, Stop, Suspend, error_parts, outcome, recorded
from .types import Checkpoint, StepKind, StepStatus, WaitKind


@dataclass(frozen=True, slots=True)
class InlineCall:
    """What ``wf.step`` was asked to run inline: ``fn(*args, **kwargs)``, tried
    ``1 + retries`` times, each try at most ``timeout`` seconds."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    retries: int
    timeout: float | None


class InlineSteps:
    """The inline steps of one advance, and the deadline of the try under way (which
    ``wf.cancel_requested`` reads)."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay
        self._deadline: float | None = None

    def past_deadline(self) -> bool:
        """Whether the try under way has run past its ``timeout``."""
        return self._deadline is not None and time.monotonic() > self._deadline

    def run(
        self,
        key: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        retries: int,
        timeout: float | None,
    ) -> Any:
        """``wf.step(key, fn, *args, **kwargs)`` for a plain function: its recorded
        value or failure, or its next try (see the module docstring)."""
        replay = self._replay
        done = replay.replayed(key, StepKind.STEP)
        if done is not None:
            checked, step = key, None
        else:
            checked, step = replay.reach(key, StepKind.STEP)
        if type(retries) is not int or retries != 0 or timeout is not None:
            retries = validation.retries(retries, f"step {checked!r}")
            if timeout is not None:
                timeout = validation.seconds(timeout, f"step {checked!r}: timeout")
        if done is not None or (done := recorded(step)) is not None:
            return done.value
        if step is not None and step.wake_at is not None and replay.now() < step.wake_at:
            raise Suspend(WaitKind.RETRY, checked, step.wake_at)
        # Checked before every try, as an activity's are when its job is staged.
        validation.to_json(
            {"args": list(args), "kwargs": kwargs}, f"the arguments of step {checked!r}"
        )
        tries = (step.attempts if step is not None else 0) + 1
        return self._try(checked, step, tries, InlineCall(fn, args, kwargs, retries, timeout))

    def _try(self, key: str, step: Checkpoint | None, tries: int, call: InlineCall) -> Any:
        replay = self._replay
        timeout = call.timeout
        started = time.monotonic()
        self._deadline = None if timeout is None else started + timeout
        attributes: dict[str, AttributeValue] = {"workflow.step": key, "workflow.try": tries}
        recording = False
        recorded_step: Checkpoint | None = None
        try:
            with hooks.workflows_tracer().span("workflow.step", attributes=attributes):
                with transaction.atomic(using=store.alias()), _Statements(store.alias()) as ran:
                    value = call.fn(*call.args, **call.kwargs)
                    result_json = validation.to_json(value, f"the result of step {key!r}")
                    if timeout is not None and time.monotonic() - started > timeout:
                        raise TimeoutError(
                            f"step {key!r} ran longer than its timeout of {timeout:g} s"
                        )
                    recording = True
                    fault_point("workflows.step.before_checkpoint", run=replay.run.pk, key=key)
                    now = replay.now()
                    # The fence last: the run row stays unlocked while the step works.
                    # A step that wrote nothing has nothing to commit with its
                    # checkpoint: its transaction ends empty, and the checkpoint is
                    # the one statement after it.
                    if ran.wrote or not ran.alone:
                        recorded_step = self._record(key, step, tries, result_json, now)
                if recorded_step is None:
                    recorded_step = self._record(key, step, tries, result_json, now)
                step = recorded_step
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
            self._ended("failed", started)
            return self._failed_try(key, step, tries, call.retries, exc)
        finally:
            self._deadline = None
        self._ended("succeeded", started)
        replay.record(step)
        fault_point("workflows.step.after_checkpoint", run=replay.run.pk, key=key)
        return outcome(step)

    def _record(
        self, key: str, step: Checkpoint | None, tries: int, result_json: str, now: datetime
    ) -> Checkpoint:
        """A successful try's checkpoint, written in one fenced statement."""
        return self._replay.settle_alone(
            key,
            step,
            StepKind.STEP,
            StepStatus.SUCCEEDED,
            now,
            attempts=tries,
            result_json=result_json,
            wake_at=None,
        )

    def _ended(self, result: str, started: float) -> None:
        name = self._replay.run.name
        hooks.step_ended(name, StepKind.STEP.value, result, time.monotonic() - started)

    def _failed_try(
        self, key: str, step: Checkpoint | None, tries: int, retries: int, exc: Exception
    ) -> Any:
        replay = self._replay
        error_type, message = error_parts(exc)
        now = replay.now()
        retry_at = now + timedelta(seconds=retry_pace().delay(tries)) if tries <= retries else None
        status = StepStatus.WAITING if retry_at is not None else StepStatus.FAILED
        fields: dict[str, Any] = {
            "attempts": tries,
            "error_type": error_type[:200],
            "error": message,
            "wake_at": retry_at,
        }
        with replay.write():
            step = replay.settle(key, step, StepKind.STEP, status, now, **fields)
            if retry_at is not None:
                replay.wake_at(retry_at, "retry", f"{key}:{tries}", now)
        replay.record(step)
        if retry_at is not None:
            raise Suspend(WaitKind.RETRY, key, retry_at)
        return outcome(step)  # the recorded failure, raised


class _Statements:
    """``with _Statements(alias) as ran:`` — whether the block left anything to commit
    on ``alias``'s connection (``ran.wrote``: a statement ran, or an ``on_commit``
    callback waits for the commit), and whether a checkpoint written after the block
    would be a statement of its own (``ran.alone``: the block's transaction is the
    connection's outermost, and the database writes a fenced checkpoint in one
    statement)."""

    def __init__(self, alias: str) -> None:
        self._connection = connections[alias]
        self._wrapper = self._connection.execute_wrapper(self._count)
        self._ran = False
        self.alone = False

    def _count(self, execute: Callable[..., Any], *args: Any) -> Any:
        self._ran = True
        return execute(*args)

    @property
    def wrote(self) -> bool:
        # A callback must run only once the checkpoint has committed with it.
        return self._ran or bool(self._connection.run_on_commit)

    def __enter__(self) -> _Statements:
        connection = self._connection
        self.alone = connection.vendor == "postgresql" and len(connection.atomic_blocks) == 1
        self._wrapper.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._wrapper.__exit__(*exc_info)
