"""The lease keeper: renews the leases of the attempts the worker holds (the
heartbeat) and passes on what the database says of them — a cancel request, or an
attempt that ended elsewhere after its lease was lost."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ledon.engine import FAILED

from .. import execution
from ..types import CancelReason, ExecutionStatus
from .interfaces import WorkerInterface


class LeaseKeeper:
    """Heartbeat and cancellation watch over the held attempts."""

    def __init__(self, worker: WorkerInterface) -> None:
        self._worker = worker
        self._holdings = worker.holdings
        self._check_now = threading.Event()

    def check_soon(self) -> None:
        """A cancel was requested somewhere (NOTIFY): check at the next pass."""
        self._check_now.set()

    def check_due(self) -> bool:
        """Whether :meth:`check_soon` was called since the last check (and clear it)."""
        if self._check_now.is_set():
            self._check_now.clear()
            return True
        return False

    def heartbeat(self) -> None:
        """Renew the leases of the held attempts, but not of timed-out ones: a
        handler past its timeout cannot keep its attempt alive (should this worker
        fail to end it, another recovers it)."""
        with self._holdings.lock:
            tokens = [h.claim.token for h in self._holdings.entries_locked() if not h.ctx.timed_out]
        worker = self._worker
        self._watch(
            lambda tokens: execution.heartbeat(tokens, worker.worker_id, now=worker.clock()),
            "lease renewal",
            tokens,
        )

    def check_cancel(self) -> None:
        """Read whether a cancel was requested for any held attempt."""
        self._watch(execution.execution_statuses, "cancellation check", self._holdings.tokens())

    def _watch(
        self,
        read: Callable[[Sequence[str]], dict[str, ExecutionStatus]],
        what: str,
        tokens: list[str],
    ) -> None:
        """Read the attempts' states (renewing leases or not) and act on them."""
        if not tokens:
            return
        states = self._worker.guarded(what, lambda: read(tokens))
        if states is not FAILED:
            self._apply(states)

    def _apply(self, states: dict[str, ExecutionStatus]) -> None:
        with self._holdings.lock:
            held = {t: self._holdings.get_locked(t) for t in states}
        for token, state in states.items():
            entry = held[token]
            if entry is None or entry.ctx.cancel_requested or entry.returned:
                # A returned handler has nothing to stop; its end, waiting for a
                # settle, is fenced by its token (it may be a settle whose commit
                # happened with the answer lost: the job then ended as it returned).
                continue
            if state is ExecutionStatus.CANCEL_REQUESTED:
                self._worker.emit("cancel-requested", entry.claim)
                entry.ctx.signal_cancel()
            elif state is ExecutionStatus.ENDED:
                # The attempt ended elsewhere (recovered after a lost lease); whatever
                # the handler returns now is fenced off by its token.
                self._worker.emit("lost", entry.claim, "attempt ended elsewhere; stopping handler")
                entry.ctx.signal_cancel(CancelReason.LOST)
