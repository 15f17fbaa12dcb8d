"""The time a transition is recorded at, the same rule in every app's store — read
on the database server's clock.

Leases, due times, timers, schedules and rate windows are written by one machine and
compared by another, so they must be read on one clock: the database server's. An
engine process measures how far its host's clock is from the server's
(:func:`align`: at start-up, then every :data:`ALIGN_INTERVAL` seconds, on a thread
of its own, :class:`ClockKeeper`), and :func:`now` — every engine's clock and every
store's default time — is this host's clock plus that offset. So a worker whose host
clock is a minute off neither takes live workers' attempts nor runs a delayed job or
a timer early: it reads the time the others read.

The offset is measured over a round trip: when the server's time falls inside it, the
two clocks agree as far as anyone can tell, and the offset is zero; outside it, the
offset puts this host's clock at most a round trip behind the server's, never ahead
(a timer is never early by the measurement's error). Until an engine measured it —
in a web process, on SQLite, whose clock is this host's — the offset is zero and
:func:`now` is :func:`django.utils.timezone.now`.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError, InterfaceError, connections
from django.utils import timezone

logger = logging.getLogger(__name__)

#: Seconds between two measurements of the database's clock in an engine process.
ALIGN_INTERVAL = 30.0
#: Round trips of one measurement; the shortest one counts.
SAMPLES = 3
#: Two clocks closer than this agree: a timestamp's rounding is not a skew.
AGREEMENT = timedelta(milliseconds=1)
#: An offset this large is said once, at WARNING, when it is first measured.
WORTH_SAYING = timedelta(seconds=1)

_offset = timedelta(0)
_lock = threading.Lock()


def aware_utc(value: object, what: str, *, error: type[Exception]) -> datetime:
    """``value`` as an aware datetime in UTC (microseconds kept), else ``error``
    saying why: a naive time has no meaning across machines."""
    if not isinstance(value, datetime):
        raise error(f"{what} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise error(f"{what} must be timezone-aware (UTC is used throughout)")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        # datetime.max at a negative offset is past year 9999 in UTC.
        raise error(f"{what} {value.isoformat()} is out of range in UTC") from None


def now() -> datetime:
    """The current time on the database server's clock, as this process knows it:
    this host's clock plus the offset last measured (zero until then)."""
    return timezone.now() + _offset


def offset() -> timedelta:
    """The database server's clock minus this host's, as last measured."""
    return _offset


def current_time(now_: datetime | None, *, error: type[Exception]) -> datetime:
    """``now_`` (checked by :func:`aware_utc`) or, when None, :func:`now`. Stores
    take the time from their callers so that tests and engines can inject a clock."""
    return now() if now_ is None else aware_utc(now_, "now", error=error)


def measure(alias: str) -> timedelta | None:
    """How far the clock of the server of database ``alias`` is from this host's
    (see the module docstring); None for a database without a server (SQLite)."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return None
    best: tuple[timedelta, timedelta] | None = None
    with connection.cursor() as cursor:
        for _ in range(SAMPLES):
            before = timezone.now()
            cursor.execute("SELECT clock_timestamp()")
            (server,) = cursor.fetchone()
            after = timezone.now()
            if before - AGREEMENT <= server <= after + AGREEMENT:
                found = timedelta(0)
            else:
                found = server - after
            if best is None or after - before < best[0]:
                best = (after - before, found)
    assert best is not None
    return best[1]


def align(alias: str) -> timedelta | None:
    """Measure the offset of the server of ``alias`` (:func:`measure`) and read
    :func:`now` with it from now on; the offset, or None (nothing measured). Raises
    the database's error when the server cannot be reached."""
    global _offset
    found = measure(alias)
    if found is None:
        return None
    with _lock:
        before, _offset = _offset, found
    if abs(found - before) >= WORTH_SAYING:
        logger.warning(
            "this host's clock is %.3f s %s the database server's: leases, due times, "
            "timers, schedules and rates are read on the server's clock",
            abs(found.total_seconds()),
            "ahead of" if found < timedelta(0) else "behind",
            extra={"offset": found.total_seconds()},
        )
    return found


class ClockKeeper:
    """Measures the database's clock again every :data:`ALIGN_INTERVAL` seconds on a
    thread of its own, while an engine runs (a host's clock may be stepped, by NTP or
    by hand; a failover may bring another server). A failed measurement keeps the
    last offset: the engine reports outages itself."""

    def __init__(self, alias: str, *, interval: float = ALIGN_INTERVAL) -> None:
        self.alias = alias
        self.interval = interval
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._main, name="clock-keeper", daemon=True)

    def start(self) -> ClockKeeper:
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        self._closing.set()
        self._thread.join(timeout)

    def _main(self) -> None:
        try:
            while not self._closing.wait(self.interval):
                try:
                    align(self.alias)
                except (DatabaseError, InterfaceError):
                    pass  # the last offset stands; the next interval tries again
                finally:
                    # One short round trip every interval: hold no connection between.
                    connections[self.alias].close()
        finally:
            connections.close_all()
