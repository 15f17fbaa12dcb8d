"""Errors raised by the sagas app. ``SagaError`` is their root; how to catch and raise
them is said once for every app, at :class:`ledon.errors.DocumentedError`."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from django.core.exceptions import ImproperlyConfigured

from ledon.errors import DocumentedError

if TYPE_CHECKING:
    from .types import SagaSnapshot, SagaStatus


class SagaError(DocumentedError):
    """An error of the sagas app."""


class InvalidInput(SagaError, ValueError):
    """The input is not valid."""


class InvalidSagaDefinition(InvalidInput):
    """The saga definition is not valid."""


class InvalidSagaData(InvalidInput):
    """Saga data must be a JSON object: a dict with string keys whose values are
    dicts, lists, strings, finite numbers, booleans or None."""


class UnknownSaga(SagaError, LookupError):
    """No saga is registered under this name."""


class SagaDefinitionMismatch(SagaError):
    """The saga's registered definition no longer has every step the stored instance
    was started with; the instance is left untouched."""


class SagaNotFound(SagaError, LookupError):
    """No saga instance has this id."""


class InvalidTransition(SagaError):
    """The saga instance's current state does not allow this operation."""


class SagaLeased(InvalidTransition):
    """Another runner holds this saga instance's lease; it is being driven there."""


class SagaConcurrencyError(SagaError):
    """The saga instance changed since it was read (its version moved on); nothing
    was overwritten."""

    def __init__(self, message: str | None = None, *, instance_id: uuid.UUID | None = None):
        self.instance_id = instance_id
        super().__init__(message)


class SagaLeaseLost(SagaConcurrencyError):
    """Another runner took over this saga instance; this one stopped driving it."""


class AmbientTransactionError(SagaError):
    """run_saga() runs each step in a transaction of its own and refuses to run inside
    an open transaction.atomic() block; use start_saga() to record the instance as part
    of it and let recover_sagas drive it."""


class StepCancelled(SagaError):
    """The step was asked to stop (its timeout passed, or its runner lost the lease)."""


class StepTimedOut(SagaError):
    """The step did not finish within its timeout."""


class StepKeptDying(SagaError):
    """The runners driving this step kept stopping without finishing it (their leases
    expired ``MAX_TAKEOVERS`` times): the step counts as failed."""


class RecordedStepFailure(SagaError):
    """A step of this saga instance failed in an earlier run; the stored error follows."""


class SagaIdentityConflict(SagaError):
    """An instance of this saga already exists with this idempotency key and other
    data; send the identical request, or use another key."""

    def __init__(self, name: str, idempotency_key: str) -> None:
        self.name = name
        self.idempotency_key = idempotency_key
        super().__init__(
            f"saga {name!r} already has an instance with idempotency key "
            f"{idempotency_key!r} started with other data; repeat the identical request "
            "or use another key"
        )


class SagaExecutionError(SagaError):
    """A saga step failed; the completed steps were compensated (or, if a compensation
    kept failing, the instance needs attention). The step's exception is the
    ``__cause__``."""

    def __init__(
        self,
        saga_name: str,
        instance_id: uuid.UUID,
        failed_step: str,
        *,
        status: SagaStatus,
        snapshot: SagaSnapshot | None = None,
    ) -> None:
        self.saga_name = saga_name
        self.instance_id = instance_id
        self.failed_step = failed_step
        self.status = status
        self.snapshot = snapshot
        what = f"step {failed_step!r} failed" if failed_step else "compensation was requested"
        if snapshot is not None and snapshot.compensation_error:
            outcome = "a compensation kept failing: the instance needs attention"
        else:
            outcome = "the completed steps were compensated"
        super().__init__(f"saga {saga_name!r} instance {instance_id}: {what}; {outcome}")


class SagasConfigurationError(SagaError, ImproperlyConfigured):
    """The SAGAS setting is not valid."""
