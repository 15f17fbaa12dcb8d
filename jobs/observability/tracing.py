"""OpenTelemetry spans of job attempts (``JOBS["TRACING"]``, the ``[otel]``
extra), as the outermost middleware of every handler (:mod:`jobs.middleware`).

Each attempt's span (``jobs.attempt <handler>``, kind consumer) is a child of the span
that submitted or staged the job — its context is stored with the job
(``jobs_job.trace_context``) — so that a web request, its job's attempts and what they
cause are one trace. An attempt that raises records the error on its span; when a
retry may follow, its context is kept with the job, and the next attempt's span links
to it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.utils.decorators import sync_and_async_middleware

from ledon.tracing import Span, carrier_text, read_carrier, tracer

from ..store.telemetry import note_attempt_trace

if TYPE_CHECKING:
    from ..handlers import JobContext

#: The key, in a job's stored trace context, of its last failed attempt's traceparent.
PREVIOUS_ATTEMPT = "ledon-previous-attempt"


@contextmanager
def attempt_span(ctx: JobContext) -> Iterator[Span]:
    """The span of one attempt, current while its handler runs (errors are recorded on
    it; noting a failed attempt for the next one's link is :func:`note_failure`)."""
    stored = read_carrier(ctx.claim.trace_context)
    previous = stored.pop(PREVIOUS_ATTEMPT, None)
    with tracer("jobs").span(
        f"jobs.attempt {ctx.handler}",
        kind="consumer",
        parent=stored,
        links=[{"traceparent": previous}] if previous else [],
        attributes={
            "ledon.job.id": ctx.job_id,
            "ledon.job.scope_hash": ctx.scope_hash,
            "ledon.job.handler": ctx.handler,
            "ledon.job.version": ctx.version,
            "ledon.job.queue": ctx.queue,
            "ledon.job.attempt": ctx.attempt,
            "ledon.worker.id": ctx.worker_id,
        },
    ) as span:
        yield span


def note_failure(ctx: JobContext, span: Span) -> None:
    """An attempt raised: if a retry may follow, keep this attempt's context with the
    job so that the next attempt's span links to it."""
    own = span.carrier().get("traceparent")
    if own and ctx.claim.attempts_left > 0:
        stored = read_carrier(ctx.claim.trace_context)
        note_attempt_trace(ctx.token, carrier_text({**stored, PREVIOUS_ATTEMPT: own}) or "")


def _note_failure_off_the_loop(ctx: JobContext, span: Span) -> None:
    try:
        note_failure(ctx, span)
    finally:
        # A pooled helper thread: never leave a connection open on it.
        connections.close_all()


@sync_and_async_middleware
def tracing_middleware(call_next: Callable[..., Any]) -> Callable[..., Any]:
    """The middleware ``JOBS["TRACING"]`` puts first: each attempt in its span."""
    if inspect.iscoroutinefunction(call_next):

        async def async_middleware(ctx: JobContext) -> Any:
            with attempt_span(ctx) as span:
                try:
                    return await call_next(ctx)
                except BaseException:
                    await asyncio.to_thread(_note_failure_off_the_loop, ctx, span)
                    raise

        return async_middleware

    def middleware(ctx: JobContext) -> Any:
        with attempt_span(ctx) as span:
            try:
                return call_next(ctx)
            except BaseException:
                note_failure(ctx, span)
                raise

    return middleware
