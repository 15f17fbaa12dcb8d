"""Creating runs: a caller's run (in its own transaction or the caller's) and a
parent's child run (inside the parent's fenced transaction)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import IntegrityError, transaction

from ledon.db import in_caller_atomic_block
from ledon.values import from_row

from ..exceptions import AmbientTransactionError, TransactionRequiredError, WorkflowIdentityConflict
from ..models import WorkflowRun
from ..observability import hooks
from ..types import ChildRun, DrivenRun, RunSnapshot, RunStatus, WaitKind
from ..validation import child_run_id
from .base import alias, current_time
from .deadlines import stage_deadline
from .reads import snapshot
from .waking import wake


def _create(
    scope_hash: str,
    run_id: str,
    name: str,
    version: int,
    input_json: str,
    now: datetime,
    parent_pk: int | None = None,
    parent_key: str = "",
    *,
    any_version: bool = False,
    timeout: float | None = None,
    tags: dict[str, str] | None = None,
) -> RunSnapshot:
    """Insert the run and its first advance job, or return the same request's run.
    ``timeout``: seconds to its deadline (see :mod:`.deadlines`); not part of the
    request's identity.
    ``any_version``: the caller named no version, so a run of any version of ``name``
    is the same request (a retry after a deploy that added a version finds the run
    it started). ``tags`` are part of the request. Runs inside the caller's atomic
    block."""
    tags = tags or {}
    try:
        with transaction.atomic(using=alias()):
            run = WorkflowRun.objects.create(
                scope_hash=scope_hash,
                run_id=run_id,
                name=name,
                version=version,
                input_json=input_json,
                status=RunStatus.WAITING,
                wait_kind=WaitKind.START,
                parent_id=parent_pk,
                parent_key=parent_key,
                tags=tags,
                created_at=now,
                updated_at=now,
                deadline=None if timeout is None else now + timedelta(seconds=timeout),
            )
    except IntegrityError:
        existing = WorkflowRun.objects.for_scope(scope_hash).filter(run_id=run_id).first()
        if existing is None:
            raise
        differing = [
            field
            for field, stored, asked in (
                ("name", existing.name, name),
                ("version", existing.version, existing.version if any_version else version),
                ("input", existing.input_json, input_json),
                ("tags", existing.tags, tags),
            )
            if stored != asked
        ]
        if differing:
            raise WorkflowIdentityConflict(
                f"run {run_id!r} exists in this scope as {existing.name!r} version "
                f"{existing.version} with another {', '.join(differing)}; a run id names "
                "one request"
            ) from None
        return snapshot(existing, created=False)
    wake(run.pk, 0, "start", now=now)
    stage_deadline(run.pk, 0, run.deadline, now)
    transaction.on_commit(lambda: hooks.started(name, version), using=alias())
    return snapshot(run, created=True, with_steps=False)


def create_run(
    scope_hash: str,
    run_id: str,
    name: str,
    version: int,
    input_json: str,
    *,
    staged: bool,
    any_version: bool = False,
    timeout: float | None = None,
    tags: dict[str, str] | None = None,
) -> RunSnapshot:
    """Create a run: in its own transaction (``staged`` False; refuses the caller's
    atomic block) or inside the caller's (``staged`` True; requires one).
    ``any_version``, ``timeout``, ``tags``: see :func:`_create`."""
    using = alias()
    inside = in_caller_atomic_block(transaction.get_connection(using))
    if staged and not inside:
        raise TransactionRequiredError()
    if not staged and inside:
        raise AmbientTransactionError()
    now = current_time()

    def create() -> RunSnapshot:
        return _create(
            scope_hash,
            run_id,
            name,
            version,
            input_json,
            now,
            any_version=any_version,
            timeout=timeout,
            tags=tags,
        )

    if staged:
        try:
            return create()
        except WorkflowIdentityConflict:
            # Like stage_job: the caller's work cannot commit without its run.
            transaction.set_rollback(True, using=using)
            raise
    with transaction.atomic(using=using):
        return create()


def create_child(
    parent: DrivenRun,
    key: str,
    name: str,
    version: int,
    input_json: str,
    now: datetime,
    *,
    timeout: float | None = None,
) -> ChildRun:
    """Create the child run ``"{run_id}/{key}"`` in the parent's scope (inside the
    parent's fenced transaction); the same child again is the existing run.
    ``timeout``: its workflow's declared one.

    A run of that id that is not this parent's child (a caller started it) is
    :class:`WorkflowIdentityConflict`: it would never wake the parent when it ends."""
    run_id = child_run_id(parent.run_id, key)
    _create(
        parent.scope_hash,
        run_id,
        name,
        version,
        input_json,
        now,
        parent_pk=parent.pk,
        parent_key=key,
        timeout=timeout,
    )
    child = WorkflowRun.objects.for_scope(parent.scope_hash).get(run_id=run_id)
    if child.parent_id != parent.pk:
        raise WorkflowIdentityConflict(
            f"run {run_id!r} exists in this scope and is not the child {key!r} of run "
            f"{parent.run_id!r}; a child's run id is the parent's, '/', and its key"
        )
    return from_row(ChildRun, child, pk=child.pk, status=RunStatus(child.status))
