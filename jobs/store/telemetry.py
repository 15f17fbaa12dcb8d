"""What the store tells observers of submissions: a span around each submit or
stage (its context is stored with the new jobs, see :func:`.submission._new_row`),
and :data:`jobs.signals.jobs_enqueued` for the jobs it created. Also the one write
tracing makes: the trace context of a failed attempt, for the next attempt's link."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal, cast

from django.db import transaction

from ledon.db import alias_for
from ledon.tracing import AttributeValue, tracer

from ..models import Job
from ..signals import jobs_enqueued
from ..types import JobSnapshot, JobSubmission, SubmitResult


def _described(args: tuple[Any, ...]) -> tuple[str, dict[str, AttributeValue]]:
    """The span name and attributes of ``submit(scope_hash, job_id, sub)`` or
    ``submit_many(items)``."""
    if len(args) >= 3 and isinstance(args[2], JobSubmission):
        scope_hash, job_id, sub = args[:3]
        return sub.handler, {
            "ledon.job.id": job_id,
            "ledon.job.scope_hash": scope_hash,
            "ledon.job.handler": sub.handler,
            "ledon.job.version": sub.handler_version,
            "ledon.job.queue": sub.queue,
        }
    items = cast(Sequence[tuple[str, str, JobSubmission]], args[0] if args else ())
    handlers = sorted({sub.handler for _, _, sub in items})
    return ", ".join(handlers[:3]) + (", …" if len(handlers) > 3 else ""), {
        "ledon.job.count": len(items)
    }


def _created(result: Any) -> list[JobSnapshot]:
    if isinstance(result, JobSnapshot):
        return [result] if result.created else []
    return [
        r.snapshot
        for r in cast(list[SubmitResult], result)
        if r.snapshot is not None and r.snapshot.created
    ]


def observed_submission[F: Callable[..., Any]](
    kind: Literal["submit", "stage"],
) -> Callable[[F], F]:
    """Wrap a submission function of the store: its span (when tracing is on) and the
    ``jobs_enqueued`` signal for the jobs it created."""
    staged = kind == "stage"

    def decorator(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            jobs = tracer("jobs")
            if jobs.enabled:
                handler, attributes = _described(args)
                with jobs.span(
                    f"jobs.{kind} {handler}", kind="producer", attributes=attributes
                ) as span:
                    result = func(*args, **kwargs)
                    span.set_attribute("ledon.job.created", len(_created(result)))
            else:
                result = func(*args, **kwargs)
            if jobs_enqueued.receivers:
                created = _created(result)
                if created:
                    jobs_enqueued.send(
                        sender=Job, snapshots=created, staged=staged, using=alias_for(Job)
                    )
            return result

        return cast(F, wrapper)

    return decorator


def note_attempt_trace(token: str, trace_context: str) -> bool:
    """Keep ``trace_context`` — the submitter's with the ending attempt's added — on
    the job while ``token`` is its current attempt; False (nothing changed) otherwise."""
    with transaction.atomic(using=alias_for(Job)):
        return bool(
            Job.objects.filter(current_token=token, status="running").update(
                trace_context=trace_context
            )
        )
