"""Concurrent steps: an activity or a child run started without waiting for it, and
the checkpoint that waits for one or several of them.

``wf.start`` and ``wf.start_child`` reach their checkpoint under the replay rule
like ``wf.step`` and ``wf.child`` do (its key, its kind, its place in the order
recorded), record it and stage its work — the activity's item job, the child run —
in the advance's fenced transaction, and return a :class:`StepHandle` at once. The
body goes on: several branches of different kinds run at the same time.
``handle.result()`` and ``wf.gather(*handles)`` wait for them without a slot: what
ends a branch (its item's end, the child's end) wakes the run, and its replay
records the branch's end in its checkpoint and gives it to the body.

A handle names its checkpoint by key, so a replay makes the same handles again from
the same calls: nothing about a handle is recorded but its checkpoint.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from . import waits
from .activities import Activities
from .exceptions import InvalidHandle
from .replay import Replay, Suspend, outcome
from .types import Checkpoint, StepKind, WaitKind


@dataclass(frozen=True, slots=True, eq=False)
class StepHandle:
    """A started activity or child run of one run (``wf.start``,
    ``wf.start_child``): ``key`` is its checkpoint's key, ``kind`` ``"activity"`` or
    ``"child"``. :meth:`result` waits for it; ``wf.gather`` waits for several."""

    key: str
    kind: StepKind
    run_id: str
    _branches: Branches = field(repr=False)

    def result(self) -> Any:
        """The branch's result (an activity's return value, a child's output), or
        :class:`~workflows.exceptions.StepFailed` if it failed (or was cancelled);
        the run waits without a slot until it has ended."""
        return _active().gather((self,), single=True)[0]


#: The branches of the body running in this thread (the latest replay begun here, as
#: long as its context lives): a handle is awaited against them, never against the
#: replay that made it. A weak reference: an ended replay's checkpoints are not kept.
_running: ContextVar[weakref.ref[Branches] | None] = ContextVar("workflows_branches", default=None)


def _current() -> Branches | None:
    ref = _running.get()
    return None if ref is None else ref()


def _active() -> Branches:
    branches = _current()
    if branches is None:
        raise InvalidHandle("result(): no workflow body is running here to wait for it")
    return branches


class Branches:
    """The handles one advance started, and the waits for them."""

    def __init__(self, replay: Replay, activities: Activities) -> None:
        self._replay = replay
        self._activities = activities
        #: The handle started under each key, as started.
        self._started: dict[str, tuple[StepHandle, Checkpoint]] = {}
        _running.set(weakref.ref(self))

    def handle(self, step: Checkpoint) -> StepHandle:
        """The handle of the started checkpoint ``step``."""
        handle = StepHandle(step.key, step.kind, self._replay.run.run_id, self)
        self._started[step.key] = (handle, step)
        return handle

    def gather(self, handles: Sequence[object], *, single: bool = False) -> list[Any]:
        """Wait until every branch of ``handles`` has ended, then their results in
        the order given, or the :class:`~workflows.exceptions.StepFailed` of the first
        of them (in that order) that failed. A handle this advance did not start
        under its key is :class:`~workflows.exceptions.InvalidHandle` (nothing
        written)."""
        if _current() is not self:
            raise InvalidHandle(
                "gather(): this WorkflowContext's advance has ended; use the context the "
                "body is given now"
            )
        steps = [self._checked(handle, single=single) for handle in handles]
        ended = [self._ended(step) for step in steps]
        for step, end in zip(steps, ended, strict=True):
            if end is None:
                kind = WaitKind.CHILD if step.kind is StepKind.CHILD else WaitKind.ITEMS
                raise Suspend(kind, step.key)
        return [outcome(end) for end in ended if end is not None]

    def _checked(self, handle: object, *, single: bool) -> Checkpoint:
        what = "result()" if single else "gather()"
        if not isinstance(handle, StepHandle):
            raise InvalidHandle(
                f"{what}: {handle!r} is no StepHandle (wf.start and wf.start_child return one)"
            )
        if handle._branches is not self:
            run_id = self._replay.run.run_id
            where = (
                f"an earlier advance of this run (run {run_id!r})"
                if handle.run_id == run_id
                else f"run {handle.run_id!r}, not this run ({run_id!r})"
            )
            raise InvalidHandle(
                f"{what}: the handle of {handle.key!r} was started by {where}; a handle "
                "is awaited only where it was started (the body starts it again at "
                "every replay: use the handle that call returns)"
            )
        started = self._started.get(handle.key)
        if started is None or started[0] is not handle:
            raise InvalidHandle(
                f"{what}: the handle awaited under {handle.key!r} was not started under "
                "that key; await a handle as wf.start or wf.start_child returned it"
            )
        return started[1]

    def _ended(self, step: Checkpoint) -> Checkpoint | None:
        """The branch's checkpoint once it has ended (its end recorded), else None."""
        if step.kind is StepKind.CHILD:
            ended = waits.child_ended(self._replay, step)
        else:
            ended = self._activities.ended(step)
        if ended is not None:
            self._started[step.key] = (self._started[step.key][0], ended)
        return ended
