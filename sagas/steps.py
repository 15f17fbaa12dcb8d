"""Step threads: where a saga's steps run, and how long a driver waits for one.

Each step (or compensation) runs on a thread other than the driver's, so that the
driver can give up on it: after the step's timeout its cancellation is signalled,
after ``SAGAS["CANCEL_GRACE_SECONDS"]`` more the driver stops waiting and the step
counts as failed (:class:`~sagas.exceptions.StepTimedOut`). Starting compensation
then moves the instance's version on, so the late step can no longer commit its
completion.

The thread is the calling thread's :class:`StepThread`: it runs that thread's steps
one after another and outlives one saga, keeping its database connection as
``CONN_MAX_AGE`` allows, like a request thread. A step that is given up on keeps its
thread; the caller's next step gets a new one.

Inside a test case's transaction, which other connections cannot see, a step runs on
a thread of its own that borrows the caller's connection; nothing else may use that
connection until the step ends, so a step that ignores its cancellation is waited
for there — and still counts as failed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections, connections

from ledon.db import drop_closed_connections

from .exceptions import StepTimedOut

logger = logging.getLogger(__name__)


def _run_into(body: Callable[[], None], future: Future[None]) -> None:
    """Run ``body``; how it ends becomes ``future``'s result or exception."""
    try:
        body()
    except BaseException as exc:
        future.set_exception(exc)
    else:
        future.set_result(None)


class StepThread(threading.Thread):
    """Runs the steps that one calling thread drives, one after another."""

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
                # A connection the server closed while this thread waited (a
                # restart) is replaced before the step, not failed on by it.
                drop_closed_connections()
                _run_into(*task)
        finally:
            connections.close_all()


_step_threads = threading.local()


def step_thread_for_caller() -> StepThread:
    """The calling thread's step thread, started on first use."""
    thread: StepThread | None = getattr(_step_threads, "thread", None)
    if thread is None:
        thread = StepThread(f"saga-steps-{threading.current_thread().name}")
        thread.start()
        _step_threads.thread = thread
    return thread


def drop_step_thread_of_caller() -> None:
    """Leave the calling thread's step thread to the step it is still busy with."""
    thread: StepThread | None = getattr(_step_threads, "thread", None)
    if thread is not None:
        thread.close()
        _step_threads.thread = None


@dataclass(slots=True)
class StepOutcome:
    """How one run of a step's action or compensation ended."""

    error: BaseException | None = None
    #: The step ignored its cancellation; its thread may still be running.
    abandoned: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TimedStep:
    """One run of a step's action or compensation, with its time limits."""

    #: The step's transaction: its action (or compensation) and its mark.
    body: Callable[[], None]
    #: ``step 'charge' of saga 'checkout'``, for errors and logs.
    label: str
    #: The name of a thread of the step's own (see :meth:`run`).
    thread_name: str
    #: Seconds the step may take (None: as long as it takes).
    timeout: float | None
    #: Seconds a step gets to stop after its cancellation was signalled.
    grace: float
    cancel: threading.Event
    #: Done when the driver stops waiting for the step (an abort).
    abandoned: Future[None]
    #: Called when the timeout passed and the cancellation was signalled.
    on_timeout: Callable[[], None]
    log_extra: Mapping[str, Any]

    def run(self, *, borrow: str | None = None) -> StepOutcome:
        """Run the step on the calling thread's step thread and wait for it, at most
        the timeout plus the grace — or, with ``borrow`` (an alias), on a thread of its
        own that borrows this thread's connection to it, until it ends."""
        if borrow is None:
            future = step_thread_for_caller().submit(self.body)
            outcome = self._wait(future, must_end=False)
            if outcome.abandoned:
                drop_step_thread_of_caller()  # it is still busy with the abandoned step
            return outcome
        done: Future[None] = Future()
        shared = connections[borrow]

        def main() -> None:
            connections[borrow] = shared
            try:
                _run_into(self.body, done)
            finally:
                del connections[borrow]

        shared.inc_thread_sharing()
        try:
            threading.Thread(target=main, name=self.thread_name, daemon=True).start()
            return self._wait(done, must_end=True)
        finally:
            shared.dec_thread_sharing()

    def _wait(self, future: Future[None], *, must_end: bool) -> StepOutcome:
        wait([future, self.abandoned], self.timeout, return_when=FIRST_COMPLETED)
        if future.done():
            return StepOutcome(future.exception())
        if self.abandoned.done() and not must_end:
            return StepOutcome(StepTimedOut(f"{self.label} was abandoned"), abandoned=True)
        self.cancel.set()
        self.on_timeout()
        wait([future], self.grace)
        if future.done():
            error = future.exception()
            if error is None:
                return StepOutcome()  # it finished, and committed, just in time
            late = StepTimedOut(f"{self.label} did not finish within {self.timeout}s")
            late.__cause__ = error
            return StepOutcome(late)
        logger.error(
            "%s (saga instance %s) ignored its cancellation; %s",
            self.label,
            self.log_extra.get("instance_id", "?"),
            "waiting for it to end (it shares the test's connection)"
            if must_end
            else "abandoning it",
            extra=dict(self.log_extra),
        )
        if must_end:
            # Its completion is refused (its cancellation is set), so its work rolls back.
            wait([future])
        return StepOutcome(
            StepTimedOut(
                f"{self.label} did not finish within {self.timeout}s and ignored its "
                f"cancellation for {self.grace}s; it is treated as failed and can no "
                "longer commit"
            ),
            abandoned=True,
        )
