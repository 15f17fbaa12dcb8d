"""Checkpoints that wait for something outside the run: a timer, a signal, a child
run. The run waits without a slot; what ends the wait wakes it (the timer's advance
job, :func:`workflows.store.send_signal`, the child's end), and its replay records
the checkpoint.

Offers the fault point ``workflows.timer.wake`` (a timer's checkpoint about to
commit as fired).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from ledon.errors import storable_text
from ledon.faults import fault_point

from . import registry, store, validation
from .exceptions import SignalTimeout
from .replay import Replay, Suspend, outcome, recorded
from .types import Checkpoint, ChildRun, RunStatus, StepKind, StepStatus, WaitKind


def timer(replay: Replay, key: str, wake_time: Callable[[datetime], datetime]) -> None:
    """``wf.sleep`` and ``wf.sleep_until``: wait until ``wake_time(now)``, ``now``
    the time the timer was first reached."""
    checked, step = replay.reach(key, StepKind.SLEEP)
    if recorded(step) is not None:
        return
    now = replay.now()
    if step is None:
        wake_at = wake_time(now)
        with replay.write():
            status = StepStatus.SUCCEEDED if wake_at <= now else StepStatus.WAITING
            step = replay.insert(checked, StepKind.SLEEP, status, now, wake_at=wake_at)
            if status == StepStatus.WAITING:
                replay.wake_at(wake_at, "timer", checked, now)
        replay.record(step)
        if status == StepStatus.SUCCEEDED:
            return
        raise Suspend(WaitKind.TIMER, checked, wake_at)
    assert step.wake_at is not None
    if now < step.wake_at:
        # Woken early (another reason, or a clock behind the job's): wait again.
        with replay.write():
            replay.wake_at(step.wake_at, "timer", f"{checked}@{replay.run.advances}", now)
        raise Suspend(WaitKind.TIMER, checked, step.wake_at)
    fault_point("workflows.timer.wake", run=replay.run.pk, key=checked)
    # Read again from the timer's due time should a server crash take it back.
    step = replay.settle_alone(
        checked, step, StepKind.SLEEP, StepStatus.SUCCEEDED, now, flushed=False
    )
    replay.record(step)


def signal(replay: Replay, key: str, timeout: float | None) -> Any:
    """``wf.wait_for_signal``: the payload of signal ``key`` (one sent before the wait
    was reached is kept), or the run waits for it; :class:`SignalTimeout` once
    ``timeout`` seconds passed without it."""
    checked, step = replay.reach(key, StepKind.SIGNAL)
    if (done := recorded(step)) is not None:
        return done.value
    now = replay.now()
    arrived, payload = replay.signal_sent(checked)
    if arrived:
        result_json = validation.to_json(payload, f"signal {checked!r}")
        # The payload is the signal's durable row: read again should a server crash
        # take this checkpoint back.
        step = replay.settle_alone(
            checked,
            step,
            StepKind.SIGNAL,
            StepStatus.SUCCEEDED,
            now,
            flushed=False,
            result_json=result_json,
        )
    elif step is None and timeout is not None:
        deadline = now + timedelta(seconds=timeout)
        with replay.write():
            step = replay.insert(
                checked, StepKind.SIGNAL, StepStatus.WAITING, now, wake_at=deadline
            )
            replay.wake_at(deadline, "signal-timeout", checked, now)
    elif step is None:
        step = replay.settle_alone(checked, None, StepKind.SIGNAL, StepStatus.WAITING, now)
    elif step.wake_at is not None and now >= step.wake_at:
        step = replay.settle_alone(
            checked,
            step,
            StepKind.SIGNAL,
            StepStatus.FAILED,
            now,
            error_type="SignalTimeout",
            error=str(SignalTimeout(checked)),
        )
    replay.record(step)
    if step.status.is_finished:
        return outcome(step)
    raise Suspend(WaitKind.SIGNAL, checked, step.wake_at)


def child(replay: Replay, key: str, name: str, input: Any, version: int | None) -> Any:
    """``wf.child``: start the child run ``"{run_id}/{key}"`` and wait for it; its
    output, or :class:`~workflows.exceptions.StepFailed` if it failed or was
    cancelled."""
    step = start_child(replay, key, name, input, version)
    ended = child_ended(replay, step)
    if ended is None:
        raise Suspend(WaitKind.CHILD, step.key)
    return outcome(ended)


def start_child(replay: Replay, key: str, name: str, input: Any, version: int | None) -> Checkpoint:
    """Reach the checkpoint ``key`` of a child and, the first time, create the child
    run ``"{run_id}/{key}"`` with it (in the advance's fenced transaction), without
    waiting for it: the checkpoint as it stands."""
    checked, step = replay.reach(key, StepKind.CHILD)
    if step is not None:
        return step
    spec = registry.get_workflow(name, version)
    input_json = validation.to_json(input, f"the input of child {checked!r}")
    now = replay.now()
    with replay.write():
        started = store.create_child(
            replay.run, checked, spec.name, spec.version, input_json, now, timeout=spec.timeout
        )
        step = replay.insert(checked, StepKind.CHILD, StepStatus.WAITING, now, child_id=started.pk)
    return replay.record(step)


def child_ended(replay: Replay, step: Checkpoint) -> Checkpoint | None:
    """A child's checkpoint once its run has ended, that end recorded in it (the
    child may have ended before: a resumed parent finds the run it started before,
    and nothing would wake it for that); None while the child runs."""
    if step.status.is_finished:
        return step
    ended = store.child_run(step)
    if ended is None or ended.status not in RunStatus.finished():
        return None
    end = _child_end(ended)
    step = replay.settle_alone(
        step.key, step, StepKind.CHILD, end.pop("status"), replay.now(), **end
    )
    return replay.record(step)


def _child_end(ended: ChildRun) -> dict[str, Any]:
    """What the checkpoint of a child that ended records: its output, or its error
    (the type and first paragraph of the child's own error)."""
    if ended.status == RunStatus.SUCCEEDED:
        return {"status": StepStatus.SUCCEEDED, "result_json": ended.output_json}
    error_type, _, message = (ended.error or "").partition(": ")
    if ended.status == RunStatus.CANCELLED:
        error_type = "ChildRunCancelled"
    elif not message:
        error_type = "ChildRunFailed"
    return {
        "status": StepStatus.FAILED,
        "error_type": error_type[:200],
        "error": storable_text(
            message.split("\n\n", 1)[0]
            if message
            else f"child run {ended.run_id!r} ended {ended.status}"
        ),
    }
