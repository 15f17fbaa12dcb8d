"""Running one attempt: find its handler, invoke it, decide how the attempt ends, and
write that end through :mod:`jobs.execution`.

The one place this policy lives, used by the worker (:mod:`jobs.worker`) and by
:func:`jobs.testing.run_jobs_inline`:

- unknown handler or version: put back for later without consuming an attempt, then
  failed naming it;
- the handler raised: failed with the stored error text, and a retry scheduled when
  the handler's policy and the attempts left allow it;
- the handler raised ``Snooze(seconds)``: Snoozed, the job queued again for then,
  the execution not counted;
- it ran past its timeout, whatever it did then: failed with ``JobTimedOut``,
  retried by the policy;
- the handler returned: succeeded with its result reference (the database decides
  Cancelled if a cancel request committed first);
- either way, if the worker's own shutdown signal stopped it: released — the job
  Queued again and the attempt not counted — never completed.

:func:`run_attempt` decides (it writes nothing) and returns an :class:`AttemptEnd`;
:meth:`AttemptEnd.write` writes it. The worker sits between the two: it may batch a
success with its next claim, and retries the write while the database is down.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from . import execution
from .conf import jobs_settings
from .exceptions import JobTimedOut, UnknownHandler
from .handlers import HandlerSpec, JobContext, Snooze, get_handler
from .middleware import chain_for
from .types import FinishOutcome

#: The reason stored on an attempt that the worker's shutdown stopped.
SHUTDOWN_REASON = "released: the worker shut down"


class Ending(enum.Enum):
    """How an attempt ended, as the worker saw it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    #: This process knows no handler for the job's name and version.
    UNKNOWN_HANDLER = "unknown-handler"
    #: The worker's shutdown signal stopped the handler (released: Queued again,
    #: the attempt not counted).
    SHUTDOWN = "shutdown"
    #: The handler raised ``Snooze``.
    SNOOZED = "snoozed"


#: The worker's event for each ending (before the outcome refines it).
_EVENTS = {
    Ending.SUCCEEDED: "succeeded",
    Ending.FAILED: "failed",
    Ending.UNKNOWN_HANDLER: "failed",
    Ending.SHUTDOWN: "released",
    Ending.SNOOZED: "snoozed",
}


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """What :func:`run_attempt` decided: how the attempt ended and what to store."""

    ending: Ending
    #: The handler's result reference (a success).
    result: str | None = None
    #: The stored error text (a failure) or why the handler is unknown.
    error: str = ""
    #: When to run again after a failure (None: no automatic retry) or a snooze.
    retry_at: datetime | None = None
    #: One line for the worker's events ("ValueError: bad input (retry at …)").
    detail: str = ""
    #: A snooze: the most snoozes the handler allows (None: ``JOBS["MAX_SNOOZES"]``).
    max_snoozes: int | None = None

    @property
    def event(self) -> str:
        return _EVENTS[self.ending]

    def write(self, token: str, *, now: datetime | None = None) -> FinishOutcome:
        """Store this end for the attempt of ``token``; fenced by the token, so a
        late write of an attempt that ended elsewhere returns ``STALE``."""
        if self.ending is Ending.SUCCEEDED:
            return execution.complete(token, self.result, now=now)
        if self.ending is Ending.FAILED:
            return execution.fail(token, self.error, retry_at=self.retry_at, now=now)
        if self.ending is Ending.UNKNOWN_HANDLER:
            return execution.put_back_unknown_handler(token, self.error, now=now)
        if self.ending is Ending.SNOOZED:
            assert self.retry_at is not None
            return execution.snooze(token, self.retry_at, max_snoozes=self.max_snoozes, now=now)
        return execution.release(token, SHUTDOWN_REASON, now=now)


def run_attempt(
    ctx: JobContext,
    *,
    clock: Callable[[], datetime],
    loop: Callable[[], asyncio.AbstractEventLoop] | None = None,
    starting: Callable[[HandlerSpec], None] | None = None,
) -> AttemptEnd:
    """Run the handler of ``ctx``'s claim once and decide how the attempt ended.

    ``clock`` gives the time a retry is scheduled from; ``loop`` gives the event loop
    an ``async def`` handler runs on (None: a fresh loop for this call);
    ``starting(spec)`` is called right before the handler runs (the worker starts
    its timeout there). Writes nothing: the caller stores the end with
    :meth:`AttemptEnd.write`.
    """
    begun = begin_attempt(ctx, starting)
    if isinstance(begun, AttemptEnd):
        return begun
    try:
        result = begun.invoke(
            ctx,
            loop() if begun.is_async and loop is not None else None,
            call=chain_for(begun),  # the handler inside JOBS["MIDDLEWARE"]
        )
    except Exception as exc:
        return attempt_ended(begun, ctx, clock, error=exc)
    return attempt_ended(begun, ctx, clock, result=result)


def begin_attempt(
    ctx: JobContext, starting: Callable[[HandlerSpec], None] | None = None
) -> HandlerSpec | AttemptEnd:
    """The handler of ``ctx``'s claim, ``starting(spec)`` called (its timeout runs from
    then); or, for a handler this process does not know, the attempt's end."""
    claim = ctx.claim
    try:
        spec = get_handler(claim.handler, claim.handler_version)
    except UnknownHandler as exc:
        # Perhaps a newer worker knows it (a rolling deploy): put back.
        message = str(exc)
        return AttemptEnd(Ending.UNKNOWN_HANDLER, error=message, detail=message)
    if starting is not None:
        starting(spec)
    return spec


def attempt_ended(
    spec: HandlerSpec,
    ctx: JobContext,
    clock: Callable[[], datetime],
    *,
    result: str | None = None,
    error: BaseException | None = None,
) -> AttemptEnd:
    """How an attempt of ``spec`` ended: its handler returned ``result``, or raised
    ``error`` — the one policy for plain handlers and coroutines alike."""
    if isinstance(error, Snooze):
        if ctx.timed_out:
            return timed_out(spec, ctx, clock())
        wake_at = clock() + timedelta(seconds=error.seconds)
        return AttemptEnd(
            Ending.SNOOZED,
            retry_at=wake_at,
            detail=f"until {wake_at.isoformat()}",
            max_snoozes=spec.snooze_limit(),
        )
    if ctx.timed_out:
        return timed_out(spec, ctx, clock())
    if ctx.stopped_by_shutdown:
        return AttemptEnd(Ending.SHUTDOWN, detail="stopped by shutdown")
    if error is not None:
        failure, retry_at = spec.failure(ctx, error, clock())
        detail = f"{type(error).__name__}: {error}"
        if retry_at is not None:
            detail += f" (retry at {retry_at.isoformat()})"
        return AttemptEnd(Ending.FAILED, error=failure, retry_at=retry_at, detail=detail)
    return AttemptEnd(Ending.SUCCEEDED, result=result)


def timed_out_error(spec: HandlerSpec, *, abandoned: bool) -> JobTimedOut:
    """The ``JobTimedOut`` an attempt of ``spec`` that ran past its timeout fails with."""
    timeout = spec.timeout_seconds() or 0.0
    message = f"handler {spec.name!r} ran past its timeout of {timeout:g} s"
    if abandoned:
        grace = jobs_settings().TIMEOUT_GRACE_SECONDS
        message += f" and did not stop within the grace of {grace:g} s (its thread was left)"
    return JobTimedOut(message)


def timed_out(
    spec: HandlerSpec, ctx: JobContext, now: datetime, *, abandoned: bool = False
) -> AttemptEnd:
    """The end of an attempt that ran past its timeout — Failed with
    ``JobTimedOut`` (whatever the handler did after the signal), retried by policy."""
    exc = timed_out_error(spec, abandoned=abandoned)
    error, retry_at = spec.failure(ctx, exc, now)
    detail = str(exc) + (f" (retry at {retry_at.isoformat()})" if retry_at else "")
    return AttemptEnd(Ending.FAILED, error=error, retry_at=retry_at, detail=detail)
