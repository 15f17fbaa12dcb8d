"""Running sagas: ``run_saga`` drives an instance in the calling process,
``start_saga`` only records it for ``recover_sagas`` to drive; ``resume_saga`` and
``compensate_saga`` are the operator's levers (the admin's actions use them)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from django.db import transaction

from ledon.db import alias_for, in_caller_atomic_block, in_test_case_transaction

from . import store, validation
from .conf import sagas_settings
from .driver import Driver, EventCallback, default_runner_id
from .exceptions import (
    AmbientTransactionError,
    InvalidSagaDefinition,
    InvalidTransition,
    RecordedStepFailure,
    SagaConcurrencyError,
    SagaExecutionError,
    SagaLeased,
)
from .models import SagaInstance
from .registry import SagaDefinition, get_saga
from .types import SagaSnapshot, SagaStatus


def _definition(name: str) -> SagaDefinition:
    definition = get_saga(validation.saga_name(name))
    if not definition.steps:
        raise InvalidSagaDefinition(f"saga {name!r} has no steps")
    return definition


def _to_drive(
    instance_id: uuid.UUID | str, *, state_allows: Callable[[SagaStatus], bool], refusal: str
) -> tuple[SagaSnapshot, SagaDefinition]:
    """The instance an operator asked to drive, and its saga's definition (which must
    still have the instance's steps); :class:`InvalidTransition` with ``refusal`` if
    its state does not allow it."""
    state = store.require(instance_id)
    if not state_allows(state.status):
        raise InvalidTransition(
            f"saga instance {state.instance_id} is {state.status.label.lower()}; {refusal}"
        )
    definition = _definition(state.name)
    definition.check_plan(state.steps)
    return state, definition


def _driver(definition: SagaDefinition, owner: str, on_event: EventCallback | None) -> Driver:
    connection = transaction.get_connection(alias_for(SagaInstance))
    return Driver(definition, owner, on_event=on_event, inline=in_test_case_transaction(connection))


def _outcome(state: SagaSnapshot, cause: BaseException | None) -> SagaSnapshot:
    """Return a succeeded (or still active) instance; raise for a compensated or
    failed one, with the step's exception — or the stored error — as the cause."""
    if state.status in (SagaStatus.COMPENSATED, SagaStatus.FAILED):
        error = SagaExecutionError(
            state.name, state.instance_id, state.failed_step, status=state.status, snapshot=state
        )
        if cause is None:
            cause = RecordedStepFailure(
                f"{state.failed_step or 'compensation requested'}: {state.error}".strip()
            )
        raise error from cause
    return state


def run_saga(
    name: str,
    data: dict[str, Any] | None = None,
    *,
    idempotency_key: str | None = None,
    runner_id: str | None = None,
    on_event: EventCallback | None = None,
) -> SagaSnapshot:
    """Run the saga ``name`` with ``data`` in this process, step after step.

    Returns the succeeded instance's :class:`SagaSnapshot`. If a step fails, the
    completed steps are compensated in reverse order and :class:`SagaExecutionError`
    is raised (``failed_step``, ``instance_id``; the step's exception as ``__cause__``);
    if a compensation keeps failing, the instance is left FAILED (needs attention) and
    the same error is raised.

    With an ``idempotency_key`` already used for ``name``, the business never runs
    twice: a finished instance's outcome is returned (or raised) again; an unfinished
    one whose runner is gone is resumed from its completed steps; one that another
    runner is driving is returned as it is (status ``running``).

    Each step commits in a transaction of its own, so this refuses to run inside an
    ``atomic`` block (:class:`AmbientTransactionError`); use :func:`start_saga` there.
    """
    connection = transaction.get_connection(alias_for(SagaInstance))
    if in_caller_atomic_block(connection):
        raise AmbientTransactionError()
    definition = _definition(name)
    checked = validation.data(data)
    key = validation.idempotency_key(idempotency_key)
    owner = validation.text(
        runner_id or default_runner_id(), "runner id", validation.MAX_OWNER_LENGTH
    )
    settings = sagas_settings()
    state = store.create(
        definition.name,
        definition.step_names,
        checked,
        idempotency_key=key,
        owner=owner,
        lease_seconds=settings.LEASE_SECONDS,
    )
    if not state.created:
        if not state.status.is_active:
            return _outcome(state, None)
        claimed = store.claim(state, owner, lease_seconds=settings.LEASE_SECONDS)
        if claimed is None:
            return store.require(state.instance_id)  # another runner drives it
        definition.check_plan(claimed.steps)
        state = claimed
    driver = _driver(definition, owner, on_event)
    final = dataclasses.replace(driver.drive(state), created=state.created)
    return _outcome(final, driver.failure)


def start_saga(
    name: str, data: dict[str, Any] | None = None, *, idempotency_key: str | None = None
) -> SagaSnapshot:
    """Record a new instance of ``name`` for ``recover_sagas`` to drive, and return it.

    Inside an ``atomic`` block the instance commits (or not) with the caller's own
    rows. With an ``idempotency_key`` already used for ``name``, the existing instance
    is returned (``created`` false) and nothing is written.
    """
    definition = _definition(name)
    checked = validation.data(data)
    key = validation.idempotency_key(idempotency_key)
    return store.create(
        definition.name,
        definition.step_names,
        checked,
        idempotency_key=key,
        owner="",
        lease_seconds=sagas_settings().LEASE_SECONDS,
    )


def get_saga_instance(instance_id: uuid.UUID | str) -> SagaSnapshot | None:
    """The instance as stored now, or None."""
    return store.get(instance_id)


def _leased(state: SagaSnapshot) -> SagaLeased:
    current = store.require(state.instance_id)
    if current.leased_by:
        return SagaLeased(
            f"saga instance {state.instance_id} is leased by {current.leased_by!r} until "
            f"{current.leased_until:%Y-%m-%d %H:%M:%S} UTC; it is being driven there"
        )
    return SagaLeased(f"saga instance {state.instance_id} changed meanwhile; try again")


def resume_saga(
    instance_id: uuid.UUID | str,
    *,
    runner_id: str | None = None,
    on_event: EventCallback | None = None,
) -> SagaSnapshot:
    """Claim a running or compensating instance whose lease is free or expired and
    drive it to its end here; returns its final state (never raises for a failed step:
    read ``status``)."""
    state, definition = _to_drive(
        instance_id, state_allows=lambda status: status.is_active,
        refusal="only running or compensating instances can be resumed",
    )  # fmt: skip
    owner = runner_id or default_runner_id()
    claimed = store.claim(state, owner, lease_seconds=sagas_settings().LEASE_SECONDS)
    if claimed is None:
        raise _leased(state)
    return _driver(definition, owner, on_event).drive(claimed)


def compensate_saga(
    instance_id: uuid.UUID | str,
    *,
    reason: str = "",
    runner_id: str | None = None,
    on_event: EventCallback | None = None,
) -> SagaSnapshot:
    """Undo an instance's completed steps, here: a running one whose lease is free or
    expired stops going forward; a compensating one is resumed; a failed one (a
    compensation kept failing) tries its remaining compensations again. Returns the
    final state."""
    state, definition = _to_drive(
        instance_id, state_allows=lambda status: not status.is_finished,
        refusal="there is nothing left to compensate",
    )  # fmt: skip
    owner = runner_id or default_runner_id()
    settings = sagas_settings()
    if state.status is SagaStatus.FAILED:
        claimed = store.reopen(state, owner, lease_seconds=settings.LEASE_SECONDS)
    else:
        claimed = store.claim(state, owner, lease_seconds=settings.LEASE_SECONDS)
    if claimed is None:
        raise _leased(state)
    if claimed.status is SagaStatus.RUNNING:
        try:
            store.begin_compensation(
                claimed, owner, "", reason or "compensation requested by an operator"
            )
        except SagaConcurrencyError:
            raise _leased(state) from None
    return _driver(definition, owner, on_event).drive(store.require(claimed.instance_id))
