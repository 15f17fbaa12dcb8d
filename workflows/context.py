"""``WorkflowContext``: what a workflow body receives.

The body runs from the top at every advance. Each checkpoint method takes an
explicit key: a checkpoint recorded under that key returns its recorded value (or
raises its recorded error) without running anything; the first one not recorded
does its work — or records what it waits for — and, if it must wait, ends the
advance (the run is WAITING) without holding a worker slot.

The context checks each call's arguments and hands it to the part that owns its
kind of checkpoint, all on one :class:`~workflows.replay.Replay` of the run (the
replay rule, the fence): :class:`~workflows.inline.InlineSteps`,
:class:`~workflows.activities.Activities` (activities and maps) and
:mod:`workflows.waits` (timers, signals, children).

Fault points offered by the parts (``ledon.faults``), for crash and race tests:
``workflows.checkpoint.reached`` (a checkpoint with work to do reached, its cancel
check passed, nothing written yet; outside any transaction),
``workflows.step.before_checkpoint`` (a step's work done, its checkpoint not yet
committed), ``workflows.step.after_checkpoint``, ``workflows.timer.wake`` (a timer's
checkpoint about to commit as fired). The engine offers ``workflows.advance.suspend``
(an advance about to wait; outside any transaction) and ``workflows.map.fan_in``
(every item of a map ended, its fan-in about to be written). The store offers
``workflows.map.item_ended`` (written, its run not yet woken),
``workflows.signal.deliver``, ``workflows.take.refused`` (an advance job refused a
run: a Running one keeps the wake-up it left) and
``workflows.cancel.not_waiting`` (a cancel found the run not Waiting, its request not
yet written); the item jobs ``workflows.item.before_record``.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from ledon.clock import aware_utc

from . import patches, registry, store, validation, waits
from .activities import Activities
from .exceptions import InvalidInput, NonDeterministicWorkflow
from .handles import Branches, StepHandle
from .inline import InlineSteps
from .replay import Replay, outcome
from .types import StepKind, StepStatus, iso

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

    def __init__(
        self, driver: store.Driver, clock: Callable[[], datetime], replay: Replay | None = None
    ) -> None:
        # ``replay``: another view of the run's checkpoints (an upgrade check's, which
        # stops at the first one not recorded); by default the driver's own.
        self._replay = replay if replay is not None else Replay(driver, clock)
        self._run = driver.run
        self._inline = InlineSteps(self._replay)
        self._activities = Activities(self._replay)
        self._branches = Branches(self._replay, self._activities)
        #: The last error a checkpoint raised, with its key (see
        #: :meth:`checkpoint_of`).
        self._raised: tuple[BaseException, str] | None = None
        #: What each patch id asked for so far in this advance gave (its first
        #: answer holds for the whole advance).
        self._patches: dict[str, bool] = {}
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
        return self._inline.past_deadline() or self._replay.cancel_requested()

    @property
    def nondeterminism(self) -> NonDeterministicWorkflow | None:
        """Set when the body contradicted its recorded checkpoints: the run fails
        whatever the body did with the error."""
        return self._replay.nondeterminism

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
        if spec is None:
            assert not isinstance(fn, str)  # get_activity raises for an unknown name
            if timeout is None and retries == 0 and type(retries) is int:
                # Most of a long run's replay: a recorded step's value, nothing more.
                done = self._replay.replayed(key, StepKind.STEP)
                if done is not None:
                    return done.value
            return self._inline.run(key, fn, args, kwargs, retries=retries, timeout=timeout)
        if retries != 0 or timeout is not None:
            # An activity's job runs with the activity's own options: these would be
            # dropped without a word.
            raise InvalidInput(
                f"step {key!r}: {spec.name!r} is an @activity, whose retries and "
                "timeout are set on @activity(...), not on wf.step()"
            )
        payload = {"args": list(args), "kwargs": kwargs}
        return self._activities.run(key, StepKind.ACTIVITY, spec, [payload])

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
        results: list[Any] = self._activities.run(key, StepKind.MAP, spec, payloads)
        return results

    @_checkpoint
    def sleep(self, key: str, seconds: float) -> None:
        """Wait ``seconds`` durably: no slot is held, and the run resumes no earlier
        than the time recorded when the sleep was first reached."""
        wait = validation.seconds(seconds, f"sleep {key!r}: seconds", zero=True)
        waits.timer(self._replay, key, lambda now: now + timedelta(seconds=wait))

    @_checkpoint
    def sleep_until(self, key: str, when: datetime) -> None:
        """Wait durably until ``when`` (an aware datetime)."""
        at = aware_utc(when, f"sleep_until {key!r}: when", error=InvalidInput)
        waits.timer(self._replay, key, lambda now: at)

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
        return waits.signal(self._replay, key, wait)

    @_checkpoint
    def child(self, key: str, name: str, input: Any = None, *, version: int | None = None) -> Any:
        """Start the child run ``"{run_id}/{key}"`` of workflow ``name`` in this run's
        scope, wait for it without a slot and return its output; a child that fails
        (or is cancelled) raises :class:`StepFailed`."""
        return waits.child(self._replay, key, name, input, version)

    @_checkpoint
    def start(
        self, key: str, fn: Callable[..., Any] | str, *args: Any, **kwargs: Any
    ) -> StepHandle:
        """Start the activity ``fn`` (or the activity of that name) as one job on any
        worker, and return its :class:`~workflows.handles.StepHandle` at once: the
        body goes on while it runs. ``handle.result()`` (or :meth:`gather`) waits for
        it without a slot and returns its result, or raises :class:`StepFailed`."""
        spec = registry.get_activity(fn) if isinstance(fn, str) else registry.activity_of(fn)
        if spec is None:
            raise InvalidInput(
                f"start {key!r}: {getattr(fn, '__name__', fn)!r} is not an @activity; "
                "only activities run beside the body (wf.step runs a plain function)"
            )
        payload = {"args": list(args), "kwargs": kwargs}
        step = self._activities.start(key, StepKind.ACTIVITY, spec, [payload])
        return self._branches.handle(step)

    @_checkpoint
    def start_child(
        self, key: str, name: str, input: Any = None, *, version: int | None = None
    ) -> StepHandle:
        """Start the child run ``"{run_id}/{key}"`` of workflow ``name`` in this run's
        scope, and return its :class:`~workflows.handles.StepHandle` at once;
        ``handle.result()`` (or :meth:`gather`) waits for its output, or raises
        :class:`StepFailed` if it failed or was cancelled."""
        step = waits.start_child(self._replay, key, name, input, version)
        return self._branches.handle(step)

    def gather(self, *handles: StepHandle) -> list[Any]:
        """Wait without a slot until every started branch of ``handles`` has ended,
        and return their results in the order given. If any failed, once all have
        ended, the :class:`StepFailed` of the first failed one in that order is
        raised. A handle started by another run, or by an earlier advance, or
        awaited under another key than the one it was started under, is
        :class:`~workflows.exceptions.InvalidHandle` (nothing is written)."""
        return self._branches.gather(handles)

    @_checkpoint
    def now(self, key: str) -> datetime:
        """The current time, recorded under ``key``: every replay returns the same."""
        replay = self._replay
        checked, step = replay.reach(key, StepKind.NOW)
        if step is None:
            now = replay.now()
            result_json = validation.to_json(iso(now), "now")
            step = replay.settle_alone(
                checked, None, StepKind.NOW, StepStatus.SUCCEEDED, now, result_json=result_json
            )
            replay.record(step)
        return datetime.fromisoformat(outcome(step))

    @_checkpoint
    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new path of patch ``patch_id``: True (and
        recorded, so that every replay agrees) where the run reaches it for the first
        time; False where the run replays a part it had already passed under older
        code (it recorded checkpoints beyond this point). Old runs keep the old path,
        new runs take the new one, in one version. Asked again in one run, the same
        patch gives the same answer."""
        key = patches.marker_key(patch_id)
        if key not in self._patches:
            self._patches[key] = patches.patched(self._replay, key)
        return self._patches[key]
