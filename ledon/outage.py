"""Logging an outage of a dependency (the database) once, not once per attempt.

While the database is down an engine retries every few seconds (see
:mod:`ledon.backoff`); logging each attempt with its traceback would bury everything
else. An :class:`OutageReporter` turns a run of failures into a few lines:

- the first failure: one line at ``level`` (ERROR) saying what failed — with the full
  traceback the first time this process sees that error;
- another kind of error while the outage lasts: one WARNING line (traceback likewise);
- every ``summary_interval`` seconds: ``database unreachable for 12 s, 37 attempts,
  retrying every 2.0 s``;
- the first success: ``database reachable again after 14 s (41 failed attempts)``;
- a failure, after that, of an attempt that began before it (``began``): one WARNING
  line, and no new outage. An engine has several connections: one whose connection
  attempt or statement began while the database was unreachable can fail a few
  seconds after another found it again (its connect timeout or the round-trip
  deadline still running); that is the end of the old outage, not a new one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

#: Distinct errors whose traceback was logged; bounded so that a process that sees
#: endless variations of a message does not grow without end.
_MAX_REMEMBERED = 200


def error_key(exc: BaseException) -> tuple[str, str]:
    """What makes two errors "the same": their type and the first line of the message."""
    lines = str(exc).strip().splitlines()
    return (f"{type(exc).__module__}.{type(exc).__qualname__}", lines[0] if lines else "")


def describe(exc: BaseException) -> str:
    """``Type: first line of the message`` — the short form used in log lines."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


@dataclass(eq=False)
class OutageReporter:
    """Reports failures of ``subject`` as outages (thread-safe); ``extra`` goes into
    every line's structured fields."""

    log: logging.Logger
    subject: str = "database"
    _: KW_ONLY
    level: int = logging.ERROR
    summary_interval: float = 10.0
    clock: Callable[[], float] = time.monotonic
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        #: When the last outage ended (an attempt begun before then that fails is a
        #: straggler of it).
        self._ended_at: float | None = None
        self._attempts = 0
        self._last_summary = 0.0
        self._state = "unreachable"
        self._seen_in_outage: set[tuple[str, str]] = set()
        self._traced: set[tuple[str, str]] = set()

    @property
    def active(self) -> bool:
        """Whether the last attempt failed (an outage is under way)."""
        return self._since is not None

    @property
    def attempts(self) -> int:
        """Failed attempts in the current (or last) outage."""
        return self._attempts

    def failed(
        self,
        exc: BaseException,
        *,
        doing: str,
        retry_in: float | None,
        unreachable: bool = True,
        began: float | None = None,
    ) -> None:
        """One failed attempt at ``doing``; the next one comes in ``retry_in`` seconds
        (at most; None: the caller does not retry on a schedule of its own).
        ``unreachable`` False words it as "failing" (the database answers, the
        statement fails). ``began``: when the attempt began (on :attr:`clock`), if
        the caller knows — an attempt begun before the last outage ended does not
        start a new one."""
        now = self.clock()
        key = error_key(exc)
        with self._lock:
            active, ended_at = self._since is not None, self._ended_at
        if not active and began is not None and ended_at is not None and began < ended_at:
            self._straggler(exc, doing=doing, ended_ago=now - ended_at)
            return
        with self._lock:
            self._attempts += 1
            starting = self._since is None
            if starting:
                self._since = now
                self._last_summary = now
                self._attempts = 1
                self._seen_in_outage = set()
                self._state = "unreachable" if unreachable else "failing"
            new_here = key not in self._seen_in_outage
            self._seen_in_outage.add(key)
            trace = key not in self._traced and len(self._traced) < _MAX_REMEMBERED
            if trace:
                self._traced.add(key)
            summary = not starting and now - self._last_summary >= self.summary_interval
            if summary:
                self._last_summary = now
            since, attempts, state = self._since, self._attempts, self._state
        assert since is not None
        fields = {**self.extra, "outage_attempts": attempts, "doing": doing}
        error = describe(exc)
        retrying = "" if retry_in is None else f"; retrying in {retry_in:.1f} s"
        if starting or new_here:
            # The first failure at the outage's level; another error during it, a warning.
            message, args = (
                ("%s %s: %s failed: %s%s", (doing, error, retrying))
                if starting
                else ("%s still %s: %s failed with another error: %s", (doing, error))
            )
            self.log.log(
                self.level if starting else logging.WARNING,
                message,
                self.subject,
                state,
                *args,
                exc_info=exc if trace else None,
                extra=fields,
            )
        if summary:
            pace = "" if retry_in is None else f", retrying every {retry_in:.1f} s"
            self.log.warning(
                "%s %s for %.0f s, %d attempts%s; last: %s failed: %s",
                self.subject,
                state,
                now - since,
                attempts,
                pace,
                doing,
                error,
                extra=fields,
            )

    def _straggler(self, exc: BaseException, *, doing: str, ended_ago: float) -> None:
        self.log.warning(
            "%s reachable again %.1f s ago, but %s, begun before, failed: %s "
            "(the end of the outage, not a new one)",
            self.subject,
            ended_ago,
            doing,
            describe(exc),
            extra={**self.extra, "doing": doing},
        )

    def recovered(self) -> None:
        """An attempt succeeded: ends the outage, if one was under way."""
        if self._since is None:  # the common case, without taking the lock
            return
        now = self.clock()
        with self._lock:
            since, attempts, state = self._since, self._attempts, self._state
            self._since = None
            if since is not None:
                self._ended_at = now
        if since is None:
            return
        self.log.warning(
            "%s %s again after %.1f s (%d failed attempts)",
            self.subject,
            "reachable" if state == "unreachable" else "working",
            now - since,
            attempts,
            extra={**self.extra, "outage_attempts": attempts},
        )
