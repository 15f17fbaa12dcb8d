"""Advancing a run, and running an activity item: what the workflows' jobs do.

:func:`advance` takes the run (a new driver token), replays its body through a
:class:`~workflows.context.WorkflowContext` and ends the advance in one of four
ways: the body waits (the run is WAITING, what for recorded), returns (SUCCEEDED
with its output), raises (FAILED naming the step whose ``StepFailed`` went uncaught)
or meets its cancellation (CANCELLED). A driver that lost the run to another records
nothing and stops.

:func:`run_item` runs one try of an activity item in its job and records its end;
the last item of a step to end wakes the run.

The clock is :func:`current_time`; :mod:`workflows.testing` moves it.
"""

from __future__ import annotations

import enum
import logging
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import DatabaseError, DataError, InterfaceError, OperationalError

from jobs.attempts import timed_out_error
from jobs.context import JobContext
from jobs.handlers import PermanentFailure, Snooze, get_handler
from jobs.types import JobStatus
from jobs.validation import MAX_TEXT_LENGTH as MAX_RESULT_REF
from ledon.errors import storable_text
from ledon.faults import fault_point
from ledon.tracing import AttributeValue

from . import registry, store, validation
from .conf import retry_pace
from .context import WorkflowContext, _activity_context
from .exceptions import InvalidInput, KeepsKillingWorker, StepFailed, UntrustedJob
from .models import WorkflowRun
from .observability import hooks
from .replay import Replay, Stop, Suspend, error_parts
from .types import CancelOutcome, DrivenRun, Item, RunStatus, StepStatus

logger = logging.getLogger(__name__)

_clock: Callable[[], datetime] | None = None
_clock_lock = threading.Lock()


def current_time() -> datetime:
    """The engine's clock: the time every checkpoint is recorded at (the store's rule,
    ``ledon.clock``'s, of the clock a test set, or of the real time)."""
    clock = _clock
    return store.current_time(clock() if clock is not None else None)


def set_clock(clock: Callable[[], datetime] | None) -> None:
    """Replace the engine's clock (``None``: the real time); for tests."""
    global _clock
    with _clock_lock:
        _clock = clock


class Advanced(enum.StrEnum):
    """How an advance ended."""

    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    #: Another driver holds the run, or it finished before this advance took it.
    NOTHING = "nothing"


class VersionMissing(Exception):
    """This worker has no definition of the run's (name, version): the run waits for a
    worker that has (its advance job is put back, never failed)."""


def advance(run_pk: int, job_id: str | None = None) -> Advanced:
    """Advance run ``run_pk`` as far as it goes now (see the module docstring);
    ``job_id``: the advance job doing it (see :func:`workflows.store.take`)."""
    taken = store.take_with_steps(run_pk, job_id, now=current_time())
    if taken is None:
        return _not_taken(run_pk)
    driver = taken.driver
    first: store.Taken | None = taken
    # Past its deadline, whatever it waits for and whichever version: the run ends.
    if store.deadline_passed(driver.run.deadline, current_time()):
        return _cancelled(driver)
    spec = registry.find_workflow(driver.run.name, driver.run.version)
    if spec is None:
        store.give_back(driver, current_time())
        raise VersionMissing(
            f"no workflow {driver.run.name!r} version {driver.run.version} in this worker"
        )
    attributes: dict[str, AttributeValue] = {
        "workflow.name": spec.name,
        "workflow.version": spec.version,
        "workflow.run_id": driver.run.run_id,
    }
    # The advance is a child of its job's attempt span, and the jobs it stages (items,
    # children, wake-ups) carry its context.
    with hooks.workflows_tracer().span("workflow.advance", attributes=attributes) as span:
        while True:
            outcome = _replay(driver, spec, first)
            first = None  # a replay again reads what was recorded meanwhile
            if outcome is not None:
                span.set_attribute("workflow.outcome", outcome.value)
                return outcome


def _not_taken(run_pk: int) -> Advanced:
    """The run was not taken: it ended, or another driver holds it. Past its deadline,
    a held run is asked to stop (its driver ends it), one that went Waiting meanwhile
    ends now."""
    row = (
        WorkflowRun.objects.filter(pk=run_pk)
        .values_list("name", "version", "status", "deadline")
        .first()
    )
    if (
        row is not None
        and row[2] not in RunStatus.finished()
        and store.deadline_passed(row[3], current_time())
        and store.time_out(run_pk, current_time()) is CancelOutcome.CANCELLED
    ):
        hooks.finished(row[0], row[1], RunStatus.CANCELLED.value)
        return Advanced.CANCELLED
    return Advanced.NOTHING


def _replay(
    driver: store.Driver, spec: registry.WorkflowSpec, taken: store.Taken | None
) -> Advanced | None:
    """Run the body once from the top; None: replay again (a wake-up came meanwhile).
    ``taken``: what the take read (the run's checkpoints, the signal it waited for);
    None: read them now."""
    replay = (
        Replay(driver, current_time)
        if taken is None
        else Replay(driver, current_time, taken.steps, signal=taken.signal)
    )
    ctx = WorkflowContext(driver, current_time, replay)
    try:
        output = spec.func(ctx)
    except Suspend as wait:
        if ctx.nondeterminism is not None:
            return _fail(driver, ctx.nondeterminism, ctx.nondeterminism.key)
        return _suspend(driver, wait)
    except Stop:
        return _stopped(driver)
    except StepFailed as exc:
        failed = ctx.nondeterminism or exc
        return _fail(driver, failed, failed.key)
    except DataError as exc:
        # A value the database refuses (too long, a NUL) is no outage: trying the
        # advance again would fail the same way for ever. The run fails, naming it.
        return _fail(driver, ctx.nondeterminism or exc, ctx.checkpoint_of(exc))
    except (DatabaseError, InterfaceError):
        # An outage, not the body's fault: the advance job fails and is tried again
        # (the run stays with this job, which takes it back when it runs again).
        raise
    except Exception as exc:
        failed_step = (
            ctx.nondeterminism.key if ctx.nondeterminism is not None else ctx.checkpoint_of(exc)
        )
        return _fail(driver, ctx.nondeterminism or exc, failed_step)
    if ctx.nondeterminism is not None:
        return _fail(driver, ctx.nondeterminism, ctx.nondeterminism.key)
    try:
        output_json = validation.to_json(output, f"the output of workflow {spec.name!r}")
    except InvalidInput as exc:
        return _fail(driver, exc, "")
    return _end(driver, RunStatus.SUCCEEDED, output_json=output_json)


def _suspend(driver: store.Driver, wait: Suspend) -> Advanced | None:
    fault_point("workflows.advance.suspend", run=driver.run.pk)
    suspended = store.suspend(driver, wait.wait, current_time())
    if suspended is store.Suspended.WAITING:
        return Advanced.WAITING
    if suspended is store.Suspended.WAKE_PENDING:
        return None
    if suspended is store.Suspended.CANCEL_REQUESTED:
        # A cancel came while this advance ran: the run ends Cancelled, never waits.
        return _cancelled(driver)
    return Advanced.NOTHING


def _stopped(driver: store.Driver) -> Advanced:
    """The body stopped without an end of its own: the run's cancel was requested
    (seen at a checkpoint, or a cancel marked the checkpoint this driver was moving),
    or another driver holds the run. A driver that still holds the run ends it
    Cancelled if its cancel was requested; a stale one records nothing."""
    if store.cancel_requested(driver.run.pk):
        return _cancelled(driver)
    return Advanced.NOTHING


def _cancelled(driver: store.Driver) -> Advanced:
    """End the run Cancelled: past its deadline with ``RunTimedOut``, else as asked."""
    deadline = driver.run.deadline
    if deadline is not None and store.deadline_passed(deadline, current_time()):
        return _end(
            driver, RunStatus.CANCELLED, error=store.timed_out_error(driver.run.run_id, deadline)
        )
    return _end(driver, RunStatus.CANCELLED, error="cancelled on request")


def _fail(driver: store.Driver, exc: BaseException, failed_step: str) -> Advanced:
    error_type, message = error_parts(exc)
    detail = "".join(traceback.format_exception(exc))
    return _fail_with(driver, f"{error_type}: {message}\n\n{detail}", failed_step)


def _fail_with(driver: store.Driver, error: str, failed_step: str) -> Advanced:
    """End the run Failed with ``error`` (its type's name first), naming
    ``failed_step``; Cancelled instead if its cancel was requested (or its deadline
    passed)."""
    if store.cancel_requested(driver.run.pk):
        # The cancel lands first: whatever failed after it was asked for (a step that
        # stopped early when it saw it, a bad key) ends the run Cancelled.
        return _cancelled(driver)
    if not validation.is_key(failed_step):
        failed_step = ""  # a key that could not be a checkpoint's names none
    return _end(driver, RunStatus.FAILED, error=storable_text(error), failed_step=failed_step)


def let_go_runs_of_ended_jobs(now: datetime, *, limit: int, job_id: str | None = None) -> int:
    """Let go of up to ``limit`` runs still Running under an advance job that ended
    for good (:func:`workflows.store.holds_of_ended_jobs`; ``job_id``: only the run
    that job holds), and return how many, by one rule whoever heard of the job's end
    (its ``attempt_finished``, the crash budget's ``job_keeps_killing_worker``, or
    the upkeep's pass):

    - its worker kept dying (Interrupted at ``JOBS["MAX_INTERRUPTIONS"]``): the run
      ends Failed with :class:`~workflows.exceptions.KeepsKillingWorker`, as its
      last driver would have ended it (Cancelled instead if its cancel was asked).
      A new advance would run the same step again and kill its worker again, with a
      crash budget of its own each time: the run would never end;
    - it was cancelled: as :func:`workflows.store.advance_job_cancelled`;
    - else (its tries failed on an outage): the run goes to a new advance job
      (:func:`workflows.store.release`).
    """
    count = 0
    for hold in store.holds_of_ended_jobs(limit=limit, job_id=job_id):
        if hold.keeps_killing_worker:
            ended = _fail_with(hold.driver, _kept_killing(hold), "")
            count += ended is not Advanced.NOTHING
        elif hold.job_status is JobStatus.CANCELLED:
            store.advance_job_cancelled(store.advance_scope_hash(), hold.job_id, now)
            count += 1
        else:
            count += store.release(store.advance_scope_hash(), hold.job_id, now)
    return count


def _kept_killing(hold: store.EndedHold) -> str:
    """The error of a run whose advance job (``hold``'s) kept killing its worker."""
    where = (
        "before its first checkpoint"
        if hold.last_key is None
        else f"after its checkpoint {hold.last_key!r}, the last it recorded"
    )
    return (
        f"{KeepsKillingWorker.__name__}: the run's advance job {hold.job_id} kept "
        f"killing its worker: interrupted {hold.interruptions} times "
        f"(JOBS['MAX_INTERRUPTIONS']) in a step or the body {where}. The worker's "
        "process died each time (killed, out of memory, or past its shutdown's "
        "grace); resume the run once the cause is fixed."
    )


def _end(
    driver: store.Driver,
    status: RunStatus,
    *,
    output_json: str | None = None,
    error: str = "",
    failed_step: str = "",
) -> Advanced:
    now = current_time()
    if not store.finish(
        driver, status, now, output_json=output_json, error=error, failed_step=failed_step
    ):
        return Advanced.NOTHING
    if status is RunStatus.FAILED:
        _log_failed(driver.run, error, failed_step)
    hooks.finished(driver.run.name, driver.run.version, status.value)
    return Advanced(status.value)


def _log_failed(run: DrivenRun, error: str, failed_step: str) -> None:
    """The worker's WARNING for a failed run, its fields in ``extra=`` (as the
    engines' lines carry theirs) for a JSON formatter: ``workflow``,
    ``workflow_version``, ``run_id``, ``scope_hash``, ``step``, ``error``."""
    cause = error.split("\n", 1)[0]
    logger.warning(
        "workflow %s run %s failed%s: %s",
        run.name,
        run.run_id,
        f" at step {failed_step!r}" if failed_step else "",
        cause,
        extra={
            "workflow": run.name,
            "workflow_version": run.version,
            "run_id": run.run_id,
            "scope_hash": run.scope_hash,
            "step": failed_step,
            "error": cause,
        },
    )


def run_item(spec: registry.ActivitySpec, job: JobContext) -> str | None:
    """One try of an activity item (its job's handler): call the activity with the
    item's arguments and return its result (JSON text), which the job's own finish
    records (fenced by the attempt's token, as every finish is).

    A job's first try reads its item from its sealed payload, with no query
    (:func:`workflows.store.sealed_item`); a try again, or a job without the seal,
    is checked and counted on the item's row (:func:`workflows.store.start_item`),
    and a job without the seal (an older version's) records its result there too.
    A try that raises is a failed attempt of the job, with its error: the jobs'
    retry policy (the activity's back-off) tries it again while the activity's
    retries last, and the item's failure is recorded by the last one. A try that
    runs past its timeout fails the same way. Only the job the engine staged for the
    item runs it (:class:`~workflows.exceptions.UntrustedJob` for any other). A
    database outage while the item is read or recorded is not the activity's
    failure: the job waits and runs again, no attempt used.
    """
    sealed = store.sealed_item(job.scope_hash, job.job_id, job.payload)
    if sealed is not None and job.claim.attempt == 1:
        item_pk, count, args_json = sealed.pk, sealed.count, sealed.args_json
        item: Item | None = None
    else:
        item = _started(job)
        if item is None:
            return None
        item_pk, count, args_json = item.pk, None, item.args_json
    call = validation.from_json(args_json)
    args: list[Any] = call.get("args", [])
    kwargs: dict[str, Any] = call.get("kwargs", {})
    _activity_context.ctx = job
    try:
        value = spec.func(*args, **kwargs)
        result_json = validation.to_json(value, f"the result of activity {spec.name!r}")
        if job.timed_out:
            # Whatever it returned: its attempt fails with JobTimedOut (the jobs' rule).
            raise timed_out_error(get_handler(job.handler, job.version), abandoned=False)
        store.check_results_size(item_pk, result_json, count)
    except Exception as exc:
        _failed_try(item_pk, item, job, exc)
        raise
    finally:
        _activity_context.ctx = None
    fault_point("workflows.item.before_record", item=item_pk)
    if sealed is not None and len(result_json) <= MAX_RESULT_REF:
        return result_json
    # A job of an older version (its run woken by the items' rows), or a result
    # longer than a job's result holds: written on the item's row (fenced the same).
    with _outage_waits():
        store.end_item(
            item or store.item_at(item_pk),
            StepStatus.SUCCEEDED,
            current_time(),
            result_json=result_json,
            token=job.token,
            attempts=job.claim.attempt,
        )
    return None


def _started(job: JobContext) -> Item | None:
    """Count this try on the job's item's row and return the item; None if the item
    ended already (the job ends as its item did)."""
    payload = job.payload
    item_pk = payload.get("item") if isinstance(payload, dict) else None
    if not isinstance(item_pk, int) or isinstance(item_pk, bool):
        raise UntrustedJob(
            f"job {job.job_id!r} names no item: it runs nothing (the engine's own "
            "handlers run only the jobs it staged)"
        )
    with _outage_waits():
        item = store.start_item(item_pk, job.scope_hash, job.job_id, current_time())
    if item.status != StepStatus.RUNNING:
        _ended_already(item)
        return None
    return item


@contextmanager
def _outage_waits() -> Iterator[None]:
    """A lost database connection is not the activity's failure: the job snoozes
    (no attempt used) and its try runs again once the database is back."""
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise Snooze(retry_pace().delay(1)) from exc


def _ended_already(item: Item) -> None:
    """A job run again after its item ended (an operator retried it, or its worker
    died after the item was recorded): it ends as its item did, running nothing."""
    if item.status == StepStatus.SUCCEEDED:
        return
    error = item.error or f"item {item.index} was {item.status}"
    raise PermanentFailure(
        f"item {item.index} ended {item.status} already ({item.error_type or 'Error'}: "
        f"{error}); a run tries its failed items again when it is resumed"
    )


def _failed_try(item_pk: int, item: Item | None, job: JobContext, exc: Exception) -> None:
    """Record a failed try on its item (``item``, or read by ``item_pk``): its error
    while the job will try again, the item's failure when this was the last try
    (the job's own rule decides: :meth:`jobs.handlers.HandlerSpec.failure`). A try
    stopped by the worker's shutdown is given back, not failed: nothing is
    recorded."""
    if job.stopped_by_shutdown:
        return
    error_type, message = error_parts(exc)
    _, retry_at = get_handler(job.handler, job.version).failure(job, exc, current_time())
    if item is None:
        item = store.item_at(item_pk)
    if retry_at is not None:
        store.record_item_error(item, error_type, message)
        return
    store.end_item(
        item,
        StepStatus.FAILED,
        current_time(),
        error_type=error_type,
        error=message,
        token=job.token,
        attempts=job.claim.attempt,
    )
