"""The worker as its parts see it.

Each part (slots, settler, finisher, leases, timeouts, recovery, shutdown) is given
the worker that composes it, but knows it only through :class:`WorkerInterface`:
what the engine offers its parts, and what each part offers the others. The parts
then depend on this module and never on :mod:`jobs.worker.engine`, which imports
them all — the dependency runs one way, and a part can be built in a test around a
small stand-in.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Protocol

from ledon.engine import Failed, StopLevel
from ledon.outage import OutageReporter

from ..conf import JobsSettings
from ..types import Claim, FinishOutcome
from .holdings import HeldAttempt, Holdings, WorkerStats


class Deferral(enum.Enum):
    """What became of a success handed to the next settle (:meth:`Settler.defer`)."""

    #: No settle follows (the shutdown's last one ran): the slot finishes it alone.
    REFUSED = "refused"
    #: It completed the batch: the caller's thread settles now.
    SETTLE_HERE = "settle-here"
    #: It waits for a settle that runs elsewhere (the main loop, woken).
    QUEUED = "queued"


class FinisherInterface(Protocol):
    """What :class:`~jobs.worker.finishing.Finisher` offers the other parts."""

    def committed[T](self, call: Callable[[], T], *, one_statement: bool = False) -> T: ...

    def finish(
        self, claim: Claim, event: str, call: Callable[[], FinishOutcome], detail: str = ""
    ) -> FinishOutcome | None: ...

    def record(
        self, claim: Claim, event: str, outcome: FinishOutcome, detail: str = ""
    ) -> None: ...


class SlotsInterface(Protocol):
    """What :class:`~jobs.worker.slots.Slots` offers the other parts."""

    def claimable_locked(self, *, reserved: int) -> int: ...

    def note_round_trip_locked(self, seconds: float) -> None: ...

    def hand_over(self, claims: Iterable[Claim]) -> None: ...

    def take_waiting(self) -> list[Claim]: ...

    def give_back(self, claim: Claim, *, on_main_loop: bool = False) -> bool: ...

    def release(self, claim: Claim) -> None: ...

    def spawn(self, *, limit: int | None = None) -> bool: ...

    def handler_stopped(self, held: HeldAttempt) -> None: ...

    def retire(self, thread: threading.Thread | None) -> None: ...


class SettlerInterface(Protocol):
    """What :class:`~jobs.worker.settler.Settler` offers the other parts."""

    #: Whether a claim may have committed unseen (the recovery clears it).
    claims_unknown: bool

    def exclusive(self) -> bool: ...

    def end_exclusive(self) -> None: ...

    def settle(self, *, claim: bool, alone: bool = False, keep: bool = False) -> object: ...

    def settle_on_this_thread(self) -> Claim | None: ...

    def defer_completion(self, claim: Claim, result: str | None) -> bool: ...

    def defer(self, claim: Claim, result: str | None) -> Deferral: ...

    def has_completions(self) -> bool: ...

    def completions(self) -> dict[str, str | None]: ...

    def close(self) -> None: ...


class LeasesInterface(Protocol):
    """What :class:`~jobs.worker.leases.LeaseKeeper` offers the other parts."""

    def heartbeat(self) -> None: ...

    def check_soon(self) -> None: ...


class TimeoutsInterface(Protocol):
    """What :class:`~jobs.worker.timeouts.TimeoutWatch` offers the other parts."""

    def enforce(self) -> float | None: ...


class WorkerInterface(Protocol):
    """The worker, as its parts use it: its configuration, the engine's database
    steps and stop levels (:class:`ledon.engine.Engine`), and the other parts."""

    # Configuration (read-only for the parts).
    @property
    def alias(self) -> str: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def queues(self) -> list[str]: ...
    @property
    def concurrency(self) -> int: ...
    @property
    def listen(self) -> bool: ...
    @property
    def shutdown_timeout(self) -> float: ...
    @property
    def cancel_grace(self) -> float: ...
    @property
    def settings(self) -> JobsSettings: ...
    @property
    def clock(self) -> Callable[[], datetime]: ...

    # State shared by the parts.
    @property
    def stats(self) -> WorkerStats: ...
    @property
    def holdings(self) -> Holdings: ...

    # The other parts.
    @property
    def finisher(self) -> FinisherInterface: ...
    @property
    def settler(self) -> SettlerInterface: ...
    @property
    def slots(self) -> SlotsInterface: ...
    @property
    def leases(self) -> LeasesInterface: ...
    @property
    def timeouts(self) -> TimeoutsInterface: ...

    # The main loop and the stop levels.
    @property
    def stopping(self) -> bool: ...
    @property
    def backing_off(self) -> bool: ...
    @property
    def cancelling_event(self) -> threading.Event: ...
    @property
    def aborting_event(self) -> threading.Event: ...

    def wake(self) -> None: ...

    def clear_wake(self) -> None: ...

    def pause(self, timeout: float, *, until: threading.Event | None = None) -> None: ...

    def escalate(self, level: StopLevel) -> None: ...

    def busy(self) -> bool: ...

    def attempts_ended(self) -> None: ...

    def emit(self, event: str, claim: Claim | None = None, detail: str = "") -> None: ...

    # The engine's database steps.
    def guarded[T](self, what: str, call: Callable[[], T]) -> T | Failed: ...

    def retry_database[T](self, what: str, call: Callable[[], T]) -> T: ...

    @property
    def outage(self) -> OutageReporter: ...

    def database_failed(
        self, what: str, exc: Exception, *, began: float | None = None
    ) -> float: ...

    def database_ok(self) -> None: ...

    def reset_connection(self) -> None: ...
