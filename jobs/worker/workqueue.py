"""The slots' work queue: what the handler threads take, one item at a time — a claim
to run, the end of an ``async def`` handler that ran on the event loop, or a thread's
stop —, how many handlers run (never more than the worker's concurrency, whether
they hold a thread or run on the loop), and how many threads wait (so that the slots
start a thread only when none is free).

A batch of claims goes in under one lock acquisition, waking as many waiting threads
as it holds; an ``async def`` handler's end goes in front, so that a free thread
writes it (and frees its place) before it starts another claim.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from ..attempts import AttemptEnd
from ..types import Claim
from .holdings import HeldAttempt


@dataclass(frozen=True, slots=True)
class LoopEnd:
    """An ``async def`` handler returned (or raised) on the event loop: the slots
    write its end on a thread, as a plain handler's slot would (``returned``: the
    loop marked the attempt returned already)."""

    claim: Claim
    end: AttemptEnd
    returned: bool = False


class Stop:
    """A thread's stop: the thread that takes it ends."""


class SettleHere:
    """A success handed to the next settle on the event loop completed the batch: a
    thread settles it (and runs one of the new claims)."""


#: The item that ends one thread.
STOP = Stop()
#: The item that makes one thread settle.
SETTLE_HERE = SettleHere()

#: What a handler thread takes.
Work = Claim | LoopEnd | Stop | SettleHere


class WorkQueue:
    """A FIFO of :data:`Work` for the handler threads that keeps at most ``limit``
    handlers running: a claim is taken only while fewer run (:meth:`handler_returned`
    says one stopped), an ``async def`` handler's end or a stop at any time."""

    def __init__(self, limit: int) -> None:
        self._items: deque[Work] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._limit = limit
        #: Handlers running: claims taken (or kept) whose handler has not returned.
        self._running = 0
        #: Threads inside :meth:`get` with nothing they may take yet.
        self._waiting = 0
        #: Claims among the items.
        self._claims = 0

    def put_many(self, items: Iterable[Work]) -> int:
        """Queue ``items`` at the end; how many of the items that may be taken now
        no waiting thread will take (threads to start, if the slots may)."""
        with self._ready:
            before = len(self._items)
            for item in items:
                self._items.append(item)
                self._claims += isinstance(item, Claim)
            self._wake_locked(len(self._items) - before)
            return self._unserved_locked()

    def put_first(self, item: Work) -> int:
        """Queue ``item`` before everything waiting; as :meth:`put_many`."""
        with self._ready:
            self._items.appendleft(item)
            self._claims += isinstance(item, Claim)
            self._wake_locked(1)
            return self._unserved_locked()

    def _wake_locked(self, added: int) -> None:
        """Wake a waiting thread for each of the ``added`` items it may take now, no
        more: a thread woken for a claim that must wait for a handler to return only
        waits again, and each wake-up hands the interpreter lock around."""
        wake = min(added, self._takeable_locked(), self._waiting)
        if wake:
            self._ready.notify(wake)

    def _takeable_locked(self) -> int:
        claims = self._claims
        return len(self._items) - claims + min(claims, max(self._limit - self._running, 0))

    def _unserved_locked(self) -> int:
        return max(self._takeable_locked() - self._waiting, 0)

    def unserved(self) -> int:
        """How many items that may be taken now no waiting thread will take."""
        with self._ready:
            return self._unserved_locked()

    def get(self) -> Work:
        """The next item this thread may take, waiting for one."""
        with self._ready:
            while True:
                item = self._take_locked()
                if item is not None:
                    return item
                self._waiting += 1
                try:
                    self._ready.wait()
                finally:
                    self._waiting -= 1

    def _take_locked(self) -> Work | None:
        if not self._items:
            return None
        if self._running < self._limit or not isinstance(self._items[0], Claim):
            item = self._items.popleft()
            if isinstance(item, Claim):
                self._running += 1
                self._claims -= 1
            return item
        # The claims wait for a handler to return; an end or a stop behind them need not.
        for n, item in enumerate(self._items):
            if not isinstance(item, Claim):
                del self._items[n]
                return item
        return None

    def try_run(self) -> bool:
        """Count one more handler running, if fewer than ``limit`` run (a claim a
        thread kept for itself, outside the queue)."""
        with self._ready:
            if self._running >= self._limit:
                return False
            self._running += 1
            return True

    def handler_returned(self, held: HeldAttempt) -> None:
        """The handler of ``held`` stopped running (once: later calls change nothing):
        a claim waiting may be taken."""
        with self._ready:
            if not held.running:
                return
            held.running = False
            self._running -= 1
            if self._claims and self._waiting:
                self._ready.notify()  # a claim held back: a waiting thread takes it

    def claims(self) -> list[Claim]:
        """The claims waiting, in their order (they stay queued)."""
        with self._ready:
            return [item for item in self._items if isinstance(item, Claim)]

    def take(self, claims: Iterable[Claim]) -> list[Claim]:
        """Take out those of ``claims`` still waiting (no thread took them meanwhile);
        the rest of the queue stays as it is."""
        wanted = {claim.token for claim in claims}
        with self._ready:
            taken: list[Claim] = []
            kept: list[Work] = []
            for item in self._items:
                if isinstance(item, Claim) and item.token in wanted:
                    taken.append(item)
                else:
                    kept.append(item)
            if taken:
                self._items.clear()
                self._items.extend(kept)
                self._claims -= len(taken)
            return taken

    def take_claims(self) -> list[Claim]:
        """Take out every claim waiting (the rest stays, in its order)."""
        with self._ready:
            claims = [item for item in self._items if isinstance(item, Claim)]
            if claims:
                kept = [item for item in self._items if not isinstance(item, Claim)]
                self._items.clear()
                self._items.extend(kept)
                self._claims = 0
            return claims

    def has_claims(self) -> bool:
        with self._ready:
            return self._claims > 0
