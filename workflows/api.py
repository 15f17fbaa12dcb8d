"""The scoped, caller side: start or stage runs, send signals, read and steer the runs
of one scope. Nothing here reaches another scope: a run of another scope is
:class:`~workflows.exceptions.RunNotFound`."""

from __future__ import annotations

from typing import Any

from . import registry, store, validation
from .types import CancelOutcome, RunSnapshot, RunStatus, SignalOutcome


def _create(
    scope: str,
    run_id: str,
    name: str,
    input: Any,
    version: int | None,
    timeout: float | None,
    *,
    staged: bool,
    tags: dict[str, str] | None,
) -> RunSnapshot:
    """Check a start request and create its run (see :func:`start_workflow`)."""
    scope_hash = validation.scope_hash(scope)
    checked_id = validation.run_id(run_id)
    seconds = None if timeout is None else validation.seconds(timeout, "timeout")
    spec = registry.get_workflow(name, version)
    input_json = validation.to_json(input, "workflow input")
    checked_tags = validation.tags(tags)
    return store.create_run(
        scope_hash,
        checked_id,
        spec.name,
        spec.version,
        input_json,
        staged=staged,
        any_version=version is None,
        timeout=spec.timeout if seconds is None else seconds,
        tags=checked_tags,
    )


def start_workflow(
    scope: str,
    run_id: str,
    name: str,
    input: Any = None,
    *,
    version: int | None = None,
    timeout: float | None = None,
    tags: dict[str, str] | None = None,
) -> RunSnapshot:
    """Create run ``run_id`` of workflow ``name`` in ``scope``, in a transaction of its
    own, and queue its first advance.

    The same name, version and input again returns the existing run
    (``snapshot.created`` False); anything else is
    :class:`~workflows.exceptions.WorkflowIdentityConflict`. ``version=None`` takes the
    highest registered version for a new run, and matches an existing run of any
    version (a retry after a deploy that added a version returns the run it
    started); the run keeps its version for life. Refuses to run inside
    ``transaction.atomic`` (use :func:`stage_workflow` there).

    ``timeout``: seconds from now after which the run, if it has not finished, ends
    Cancelled with :class:`~workflows.exceptions.RunTimedOut`, its unfinished
    children and activity jobs with it (None: the workflow's declared ``timeout``,
    if any). Not a positive number of seconds is
    :class:`~workflows.exceptions.InvalidInput` (nothing written).

    ``tags`` (``{"customer": "42"}``) are business keys kept on the run, never
    changed, by which :meth:`WorkflowScope.list` and the admin find it: string keys
    (not empty, at most 100 characters) and string values (at most 200), at most 16
    pairs; anything else is :class:`~workflows.exceptions.InvalidInput` and nothing
    is written. They are part of the request: the same run id with other tags is a
    conflict.
    """
    return _create(scope, run_id, name, input, version, timeout, staged=False, tags=tags)


def stage_workflow(
    scope: str,
    run_id: str,
    name: str,
    input: Any = None,
    *,
    version: int | None = None,
    timeout: float | None = None,
    tags: dict[str, str] | None = None,
) -> RunSnapshot:
    """:func:`start_workflow` inside the caller's ``transaction.atomic`` block: the run
    exists if and only if that transaction commits (required)."""
    return _create(scope, run_id, name, input, version, timeout, staged=True, tags=tags)


def send_signal(scope: str, run_id: str, key: str, payload: Any = None) -> SignalOutcome:
    """Send signal ``key`` with a JSON ``payload`` to a run; its
    ``wf.wait_for_signal(key)`` returns the payload (a signal sent before the wait is
    reached is kept).

    Works on its own or inside the caller's ``transaction.atomic`` block (then it is
    delivered only if that commits: a consumed message and its signal commit
    together). The same key again with the same payload changes nothing
    (``ALREADY_SENT``); another payload is
    :class:`~workflows.exceptions.SignalConflict`; a finished run gives
    ``RUN_FINISHED``; an unknown run :class:`~workflows.exceptions.RunNotFound`.
    """
    scope_hash = validation.scope_hash(scope)
    checked_id = validation.existing_run_id(run_id)
    checked_key = validation.key(key, "signal key")
    payload_json = validation.to_json(payload, f"signal {checked_key!r} payload")
    return store.send_signal(scope_hash, checked_id, checked_key, payload_json)


class WorkflowScope:
    """Read and steer the runs of one scope (tenant, account, user…)."""

    __slots__ = ("scope_hash",)

    def __init__(self, scope: str) -> None:
        self.scope_hash = validation.scope_hash(scope)

    def __repr__(self) -> str:
        return f"<WorkflowScope {self.scope_hash[:12]}…>"

    def get(self, run_id: str) -> RunSnapshot | None:
        """The run with its checkpoints in the order reached, or None if this scope
        has no such run (a value no run id can be is
        :class:`~workflows.exceptions.InvalidInput`)."""
        return store.get(self.scope_hash, validation.existing_run_id(run_id))

    def list(
        self,
        status: RunStatus | str | None = None,
        name: str | None = None,
        limit: int | None = None,
        *,
        tags: dict[str, str] | None = None,
    ) -> list[RunSnapshot]:
        """The scope's runs, oldest first, filtered by status, name and ``tags`` (a
        run matches when it carries every pair given; checked as
        :func:`start_workflow` checks a run's), each with its checkpoints: a fixed
        number of queries however many runs."""
        if status is not None:
            try:
                status = RunStatus(status)
            except (ValueError, TypeError):
                raise validation.InvalidInput(f"unknown run status {status!r}") from None
        if name is not None:
            name = validation.name(name)
        checked_limit = validation.limit(limit)
        return store.list_runs(
            self.scope_hash,
            status=status,
            name=name,
            limit=checked_limit,
            tags=validation.tags(tags),
        )

    def cancel(self, run_id: str) -> CancelOutcome:
        """Cancel a run: a waiting run ends Cancelled at once; a running one sees its
        cancellation (activities through their ``JobContext``, inline steps through
        ``wf.cancel_requested``) and ends Cancelled at its next checkpoint. Its
        unfinished children are cancelled too."""
        return store.cancel(self.scope_hash, validation.existing_run_id(run_id))

    def resume(self, run_id: str) -> RunSnapshot:
        """Advance a Failed run again: recorded checkpoints return their values, the
        failed step runs again with fresh retries."""
        return store.resume(self.scope_hash, validation.existing_run_id(run_id))

    def fork(
        self, run_id: str, new_run_id: str, *, from_step: str, version: int | None = None
    ) -> RunSnapshot:
        """A new run ``new_run_id`` of the same workflow and input (on ``version``, or
        the source's) whose checkpoints reached before ``from_step`` are copies of run
        ``run_id``'s, with their recorded values: its body goes on from
        ``from_step``, and the copied inline steps are not run again. Child runs are
        copied when their checkpoint stands before ``from_step``; signals are not.
        Any run not being advanced can be forked. A step the run never reached is
        :class:`~workflows.exceptions.StepNotFound`, a taken ``new_run_id``
        :class:`~workflows.exceptions.RunExists`, a run being advanced
        :class:`~workflows.exceptions.InvalidTransition`: each writes nothing."""
        return fork_run(self.scope_hash, run_id, new_run_id, from_step, version)


def fork_run(
    scope_hash: str, run_id: str, new_run_id: str, from_step: str, version: int | None
) -> RunSnapshot:
    """:meth:`WorkflowScope.fork` in the scope of ``scope_hash`` (the admin's, which
    knows runs by their scope's hash): the arguments checked, then the fork."""
    source_id = validation.existing_run_id(run_id)
    checked_id = validation.run_id(new_run_id)
    step = validation.key(from_step, "from_step")
    name, source_version = store.identity(scope_hash, source_id)
    chosen = source_version if version is None else registry.get_workflow(name, version).version
    # A fork is a new run: its deadline is its version's declared timeout, from now.
    spec = registry.find_workflow(name, chosen)
    timeout = spec.timeout if spec is not None else None
    return store.fork(scope_hash, source_id, checked_id, step, chosen, timeout)
