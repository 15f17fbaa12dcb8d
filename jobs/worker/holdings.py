"""What the worker holds: the attempts it claimed and has not finished yet, and its
counters. Every other part reads and changes the held attempts through
:class:`Holdings`, under its one lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ledon.engine import ClaimStats

from ..handlers import HandlerSpec, JobContext
from ..types import Claim, FinishOutcome

#: A callback for what the worker does: (event, claim or None, detail).
EventCallback = Callable[[str, Claim | None, str], None]


@dataclass(slots=True)
class WorkerStats(ClaimStats):
    """What one ``run()`` of the worker did, printed as the last line of ``run_jobs``."""

    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    requeued: int = 0
    interrupted: int = 0
    put_back: int = 0
    snoozed: int = 0
    released: int = 0
    #: Jobs that ended Interrupted because they keep killing their worker.
    kept_killing: int = 0

    counters = {
        FinishOutcome.PUT_BACK: "put_back",
        FinishOutcome.KEEPS_KILLING_WORKER: "kept_killing",
    }
    if_any = (
        ("released", "released"),
        ("interrupted", "interrupted"),
        ("kept killing their worker", "kept_killing"),
        ("put back (unknown handler)", "put_back"),
        ("snoozed", "snoozed"),
        *ClaimStats.if_any,
    )

    def counted(self) -> str:
        return (
            f"claimed {self.claimed}, succeeded {self.succeeded}, failed {self.failed}, "
            f"retries scheduled {self.retried}, cancelled {self.cancelled}, "
            f"re-queued {self.requeued}, recovered {self.recovered}, purged {self.purged}"
        )


@dataclass(slots=True)
class HeldAttempt:
    """An attempt this worker holds: claimed, running, or returned and not yet finished."""

    claim: Claim
    ctx: JobContext
    #: When (``time.monotonic()``) the worker claimed it.
    claimed_at: float = 0.0
    #: When (``time.monotonic()``) its handler started; None: not started yet.
    started_at: float | None = None
    #: When (``time.monotonic()``) its handler is signalled to stop at its timeout;
    #: None: never.
    deadline: float | None = None
    #: The handler, once it started (for a timeout's error and retry).
    spec: HandlerSpec | None = None
    #: The thread running the handler (for an ``async def`` one, the thread that
    #: started it on the event loop).
    thread: threading.Thread | None = None
    #: An ``async def`` handler running on the event loop, with no thread of its own.
    on_loop: bool = False
    #: It counts among the handlers running (at most the worker's concurrency): from
    #: a slot's taking it until its handler returns or is abandoned (cleared under
    #: the work queue's lock, :meth:`~jobs.worker.workqueue.WorkQueue.handler_returned`).
    running: bool = False
    #: The handler returned (or raised): its slot writes the end.
    returned: bool = False
    #: The handler outlived its timeout's grace: the worker failed the attempt and
    #: left the thread, whose late result is dropped (and fenced by the token).
    abandoned: bool = False

    @property
    def started(self) -> bool:
        return self.started_at is not None


class Holdings:
    """The attempts the worker holds, by token, under :attr:`lock`.

    The lock is the worker's one lock: the settler's book-keeping (completions waiting,
    settles under way) shares it, so that what is held and what is being settled are
    read together.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._attempts: dict[str, HeldAttempt] = {}

    # Callers hold the lock for these (they are one step of a larger decision).

    def add_locked(self, claim: Claim) -> HeldAttempt:
        held = HeldAttempt(claim, JobContext(claim), claimed_at=time.monotonic())
        self._attempts[claim.token] = held
        return held

    def get_locked(self, token: str) -> HeldAttempt | None:
        return self._attempts.get(token)

    def drop_locked(self, token: str) -> None:
        self._attempts.pop(token, None)

    def count_locked(self) -> int:
        return len(self._attempts)

    def entries_locked(self) -> list[HeldAttempt]:
        return list(self._attempts.values())

    # These take the lock.

    def tokens(self) -> list[str]:
        with self.lock:
            return list(self._attempts)

    def count(self) -> int:
        with self.lock:
            return len(self._attempts)

    def entries(self) -> list[HeldAttempt]:
        with self.lock:
            return list(self._attempts.values())

    def get(self, token: str) -> HeldAttempt | None:
        with self.lock:
            return self._attempts.get(token)

    def drop(self, token: str) -> None:
        with self.lock:
            self._attempts.pop(token, None)
