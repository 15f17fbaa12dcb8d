"""The context a handler receives: its claim's identity and payload, progress
reporting, and the cancellation signal it polls or waits on."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import connections

from .exceptions import JobCancelled
from .types import CancelReason, Claim

if TYPE_CHECKING:
    from .retry import RetryPolicy
    from .types import BatchSnapshot


class JobContext:
    """What a handler gets: the parsed payload, identity, progress reporting, and a
    cancellation signal it can poll (``cancel_requested``) or wait on.

    ``cancel_requested`` becomes true when the job's cancellation is requested
    (``JobScope.cancel``), when the worker is shutting down, and when the attempt
    runs past its handler's timeout; ``cancel_reason`` says which came first.
    The worker keeps it current while the handler runs.
    """

    def __init__(
        self,
        claim: Claim,
        *,
        progress: Callable[[str, float, str | None], bool] | None = None,
    ) -> None:
        self.claim = claim
        self.payload: Any = claim.payload
        self._progress = progress
        self._cancel = threading.Event()
        self._shutdown = False  # set once, by the worker (a plain flag: one Event less per job)
        self._stored_cancel = False
        self._timed_out = False
        self._reason: CancelReason | None = None
        self._signal_lock = threading.Lock()
        # What runs when the signal is set for a reason (an async handler's future).
        self._cancel_callbacks: list[tuple[Callable[[], object], CancelReason]] = []
        #: A handler may set this to choose the retry policy for this attempt's
        #: failure (it overrides the handler's registered policy).
        self.retry_policy: RetryPolicy | None = None

    # identity
    @property
    def job_id(self) -> str:
        return self.claim.job_id

    @property
    def scope_hash(self) -> str:
        return self.claim.scope_hash

    @property
    def attempt(self) -> int:
        return self.claim.attempt

    @property
    def max_attempts(self) -> int:
        return self.claim.max_attempts

    @property
    def token(self) -> str:
        return self.claim.token

    @property
    def handler(self) -> str:
        return self.claim.handler

    @property
    def version(self) -> int:
        return self.claim.handler_version

    @property
    def queue(self) -> str:
        return self.claim.queue

    @property
    def worker_id(self) -> str:
        return self.claim.worker_id

    @property
    def batch(self) -> BatchSnapshot | None:
        """In a batch's ``then`` job: the batch's counts as stored now (every job of it
        final, unless an operator retried one since). None in any other job."""
        # Not at the top, as for report_progress.
        from .store.batches import THEN_SUFFIX, get_batch

        if not self.job_id.endswith(THEN_SUFFIX):
            return None
        batch = get_batch(self.scope_hash, self.job_id[: -len(THEN_SUFFIX)])
        if batch is None or batch.then_job_id != self.job_id:
            return None
        return batch

    # progress
    def report_progress(self, value: float, message: str | None = None) -> bool:
        """Record progress (a percentage, never going down). False if the attempt is
        no longer current or its cancellation was requested."""
        if self._progress is None:
            # Not at the top: handlers are imported by task modules (and the tasks
            # backend) that may load before the app registry is ready, and the store
            # imports the models.
            from . import store

            return store.report_progress(self.token, value, message)
        return self._progress(self.token, value, message)

    async def areport_progress(self, value: float, message: str | None = None) -> bool:
        """The async form of :meth:`report_progress` (runs on a helper thread)."""

        def report() -> bool:
            try:
                return self.report_progress(value, message)
            finally:
                # The helper thread is pooled: never leave a connection open on it.
                connections.close_all()

        return await asyncio.to_thread(report)

    # cancellation
    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    @property
    def cancel_reason(self) -> CancelReason | None:
        """Why the handler should stop (the first reason signalled), or None."""
        return self._reason

    @property
    def shutdown_requested(self) -> bool:
        """True when the worker, not the user, asked the handler to stop."""
        return self._shutdown

    @property
    def timed_out(self) -> bool:
        """True once the attempt ran past its handler's timeout."""
        return self._timed_out

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~jobs.exceptions.JobCancelled` if the handler should stop."""
        if self._cancel.is_set():
            raise JobCancelled()

    def wait_for_cancel(self, timeout: float | None = None) -> bool:
        """Block until cancellation is signalled or ``timeout`` passes; True if signalled."""
        return self._cancel.wait(timeout)

    async def await_for_cancel(self, timeout: float | None = None) -> bool:
        """The async form of :meth:`wait_for_cancel` (Django's ``a`` prefix)."""
        return await asyncio.to_thread(self._cancel.wait, timeout)

    # the worker's side
    def signal_cancel(
        self, reason: CancelReason = CancelReason.REQUESTED, *, shutdown: bool = False
    ) -> None:
        """Set the cancellation signal for ``reason`` (``shutdown=True``: the worker's
        shutdown). A stored cancel request ends the attempt Cancelled; a shutdown (or
        a lost attempt) re-queues it; a timeout fails it with ``JobTimedOut``."""
        if shutdown:
            reason = CancelReason.SHUTDOWN
        if reason in (CancelReason.SHUTDOWN, CancelReason.LOST):
            self._shutdown = True
        elif reason is CancelReason.TIMEOUT:
            self._timed_out = True
        else:
            self._stored_cancel = True
        with self._signal_lock:
            if self._reason is None:
                self._reason = reason
            callbacks = [call for call, when in self._cancel_callbacks if when is reason]
        self._cancel.set()
        for call in callbacks:
            call()

    def _on_cancel(self, call: Callable[[], object], reason: CancelReason) -> None:
        """Run ``call`` when the signal is set for ``reason`` (at once if it was)."""
        with self._signal_lock:
            self._cancel_callbacks.append((call, reason))
            already = reason is CancelReason.TIMEOUT and self._timed_out
        if already:
            call()

    @property
    def stopped_by_shutdown(self) -> bool:
        return self._shutdown and not self._stored_cancel

    @property
    def stopped_by_request(self) -> bool:
        """Whether a stored cancel request or the shutdown (not a timeout) stopped it:
        such an attempt is never retried automatically."""
        return self._stored_cancel or self._shutdown
