"""Errors raised by the workflows app. ``WorkflowError`` is their root; how to catch and raise
them is said once for every app, at :class:`ledon.errors.DocumentedError`."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from jobs import exceptions as jobs_exceptions
from jobs.retry import PermanentFailure
from ledon.errors import DocumentedError


class WorkflowError(DocumentedError):
    """An error of the workflows app."""


class InvalidInput(WorkflowError, ValueError):
    """The input is not valid: a scope, run id, checkpoint key, or a value that is not
    JSON. Nothing was written."""


class InvalidWorkflow(InvalidInput):
    """The workflow or activity definition is not valid (a second definition of a
    taken name and version, a bad name or option)."""


class UnknownWorkflow(InvalidWorkflow, LookupError):
    """No workflow is registered under this name (and version)."""


class UnknownActivity(InvalidWorkflow, LookupError):
    """No activity is registered under this name."""


class AmbientTransactionError(WorkflowError, jobs_exceptions.AmbientTransactionError):
    """start_workflow() runs in its own transaction and refuses to run inside an open
    transaction.atomic() block; use stage_workflow() to create the run as part of it."""


class TransactionRequiredError(WorkflowError, jobs_exceptions.TransactionRequiredError):
    """stage_workflow() must be called inside a transaction.atomic() block; use
    start_workflow() to create a run on its own."""


class WorkflowIdentityConflict(WorkflowError):
    """A run with this id exists in this scope with another name, version or input."""


class RunNotFound(WorkflowError, LookupError):
    """This scope has no run with this id."""


class RunExists(WorkflowIdentityConflict):
    """A fork was asked to create a run whose id (or a copied child's) is taken in this
    scope. Nothing was written."""


class StepNotFound(WorkflowError, LookupError):
    """The run never reached a checkpoint of this key (a fork's ``from_step``).
    Nothing was written."""


class SignalConflict(WorkflowError):
    """This signal was already sent to the run with another payload."""


class InvalidTransition(WorkflowError):
    """The run is not in a state that allows this (resume a run that has not failed)."""


class InvalidHandle(InvalidInput):
    """A :class:`~workflows.handles.StepHandle` awaited where it does not belong: one
    started by another run or by an earlier advance of this run, or awaited under
    another key than the one it was started under. Nothing was written."""


class TooManyItems(InvalidInput):
    """A ``map`` was given more items than ``WORKFLOWS["MAX_MAP_ITEMS"]`` allows
    (raised at the call; nothing was queued)."""


class ResultsTooLarge(WorkflowError, PermanentFailure):
    """An item's result would make its map's results larger than
    ``WORKFLOWS["MAX_VALUE_BYTES"]`` as one JSON list: the item fails (its try is not
    retried), and the map fails with it."""


class ResumeWouldFail(InvalidTransition):
    """Resuming this run would fail it again the same way: a checkpoint it would
    replay stands in a state that cannot succeed (say, its map's results are larger
    than ``WORKFLOWS["MAX_VALUE_BYTES"]``). Nothing was changed."""


class UntrustedJob(WorkflowError, PermanentFailure):
    """A job of a workflow engine handler that the engine did not stage for the run
    or item it names (another scope, another job id): it fails, not retried, and no
    run or item is touched."""


class StepFailed(WorkflowError):
    """A step failed after its retries (or its activity items, or its child run).

    Raised in the workflow body, which may catch it; uncaught, the run ends Failed
    naming the step. ``key`` is the step's key, ``cause_type`` and ``cause_message``
    the type name and message of the error that failed its last try.
    """

    def __init__(self, key: str, cause_type: str, cause_message: str) -> None:
        self.key = key
        self.cause_type = cause_type
        self.cause_message = cause_message
        super().__init__(f"step {key!r} failed: {cause_type}: {cause_message}")

    def __reduce__(self) -> tuple[type[StepFailed], tuple[str, str, str]]:
        return (type(self), (self.key, self.cause_type, self.cause_message))


class SignalTimeout(WorkflowError):
    """No signal arrived before the wait's timeout (raised in the workflow body)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"no signal {key!r} arrived before the wait timed out")

    def __reduce__(self) -> tuple[type[SignalTimeout], tuple[str]]:
        return (type(self), (self.key,))


class NonDeterministicWorkflow(WorkflowError):
    """The body reached a checkpoint that contradicts what the run recorded: a key
    recorded with another kind of checkpoint, the same key used twice, or a new
    checkpoint while recorded ones were skipped (``skipped`` names them, in the order
    recorded). The run ends Failed."""

    def __init__(self, key: str, detail: str, skipped: tuple[str, ...] = ()) -> None:
        self.key = key
        self.detail = detail
        self.skipped = tuple(skipped)
        super().__init__(f"checkpoint {key!r}: {detail}")

    def __reduce__(
        self,
    ) -> tuple[type[NonDeterministicWorkflow], tuple[str, str, tuple[str, ...]]]:
        return (type(self), (self.key, self.detail, self.skipped))


class RunTimedOut(WorkflowError):
    """The run did not finish by its deadline (``timeout`` seconds after it was
    created, given to ``@workflow`` or ``start_workflow``): it ended Cancelled with
    this error's type and message in ``snapshot.error``, its unfinished children and
    activity jobs cancelled with it."""


class KeepsKillingWorker(WorkflowError):
    """The run's advance job kept killing the worker that ran it: its worker's
    process died each time (killed, out of memory, or past its shutdown's grace)
    until the job reached ``JOBS["MAX_INTERRUPTIONS"]``. The run ended Failed with
    this error's type and message in ``snapshot.error`` (a new advance would only run
    the same step again); resume it once the cause is fixed."""


class WorkflowCancelled(WorkflowError):
    """The run's cancellation was requested: raised at the body's next checkpoint so
    that the run ends Cancelled (do not catch it, or re-raise it)."""


class WorkflowsConfigurationError(WorkflowError, ImproperlyConfigured):
    """The ``WORKFLOWS`` setting is not valid."""
