"""``JobsBackend``: Django's tasks framework on top of the job store."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.core import checks
from django.db import transaction
from django.utils import timezone

from ledon.db import alias_for

from .. import validation
from ..exceptions import InvalidInput, InvalidJobId, JobNotFound, TransactionRequiredError
from ..handlers import RetryPolicy, autodiscover
from ..submit_rules import submit_rules
from ..types import CancelOutcome, JobSnapshot, JobSubmission
from . import task_registry
from .compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    task_enqueued,
)
from .exceptions import TaskNotRegistered
from .options import BackendOptions, backend_options, check_options
from .results import HANDLER, HANDLER_VERSION, TaskPayload, task_result
from .signals import send_signal

if TYPE_CHECKING:
    from ..api import JobScope


class JobsBackend(BaseTaskBackend):
    """Store each enqueued task as a job; ``manage.py run_jobs`` runs it.

    Inside ``transaction.atomic`` the job is staged in the caller's transaction, so
    it exists if and only if that transaction commits; outside, it is submitted in a
    short transaction of its own. Results are read back from the job and its
    attempts. ``OPTIONS``: ``SCOPE`` (the job scope of every task result, default
    ``"django.tasks"``) and ``MODULES`` (modules that define tasks, imported by the
    worker in addition to each app's ``tasks`` module).
    """

    task_class = task_registry.JobsTask

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._options: BackendOptions | None = None

    # ------------------------------------------------------------------ configuration

    @property
    def parsed_options(self) -> BackendOptions:
        """The validated ``OPTIONS``; a configuration error if any of them is bad."""
        if self._options is None:
            self._options = backend_options(self.alias, self.options, self.queues)
        return self._options

    @property
    def scope(self) -> str:
        return self.parsed_options.scope

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        return [*super().check(**kwargs), *check_options(self.alias, self.options, self.queues)]

    def validate_task(self, task: Task[..., Any]) -> None:
        """Django's checks, the job store's limits, then record the task in this
        process's registry (so that a worker may run it)."""
        super().validate_task(task)
        try:
            validation.name(task.queue_name, "queue_name", validation.MAX_QUEUE_LENGTH)
            validation.integer(
                getattr(task, "max_attempts", 1),
                "max_attempts",
                1,
                validation.MAX_ATTEMPTS_LIMIT,
            )
            rules = task.submit_rules() if isinstance(task, task_registry.JobsTask) else {}
            submit_rules(**rules)
        except InvalidInput as exc:
            raise InvalidTask(str(exc)) from exc
        retry = getattr(task, "retry", None)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidTask(
                f"retry must be a jobs.handlers.RetryPolicy, not {type(retry).__name__}"
            )
        task_registry.register(task)

    # ------------------------------------------------------------------ enqueue

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Store the task as a job: staged in the caller's ``transaction.atomic``
        block if there is one, else submitted on its own. ``task_enqueued`` is sent
        once the job is committed (never for a rolled-back enqueue)."""
        # Not at the top, here and below: Django may import the backend before the
        # app registry is ready, and these import the models.
        from ..models import Job

        self.validate_task(task)
        payload = TaskPayload.build(task, self.alias, args, kwargs)
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            run_after = timezone.make_aware(run_after)  # USE_TZ = False: local time
        submission = JobSubmission.create(
            HANDLER,
            payload.as_json(),
            version=HANDLER_VERSION,
            queue=task.queue_name,
            priority=int(task.priority),  # Django accepts whole floats such as 2.0
            max_attempts=getattr(task, "max_attempts", 1),
            not_before=run_after,
            **(task.submit_rules() if isinstance(task, task_registry.JobsTask) else {}),
        )
        scope = self.job_scope()
        try:
            snapshot = scope.stage(None, submission)
            staged = True
        except TransactionRequiredError:
            snapshot = scope.submit(None, submission)
            staged = False
        result = task_result(task, snapshot, payload, self.alias)

        def announce() -> None:
            send_signal(task_enqueued, type(self), result)

        if staged:
            transaction.on_commit(announce, using=alias_for(Job))
        else:
            announce()
        return result

    # ------------------------------------------------------------------ results

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The task result with this id, read from its job and attempts.

        Raises ``TaskResultDoesNotExist`` for an unknown id (or a job of this scope
        that is not a task), and :class:`~jobs.backends.TaskNotRegistered` if the
        task's function is not defined in this process.
        """
        return self.result_for(self._snapshot(result_id))

    def result_for(self, snapshot: JobSnapshot) -> TaskResult[Any, Any]:
        """The ``TaskResult`` of a job read with its attempts."""
        payload = TaskPayload.parse(snapshot.payload)
        if payload is None:
            raise TaskResultDoesNotExist(snapshot.job_id)
        task = self.task_for(payload.task_path, snapshot)
        return task_result(task, snapshot, payload, self.alias)

    def task_for(self, task_path: str, snapshot: JobSnapshot) -> Task[Any, Any]:
        """The registered task, with the priority, queue, run-after and attempts the
        job was enqueued with. The path is only a registry key, never imported."""
        task = task_registry.lookup(task_path)
        if task is None:
            # Import what the worker would import (app task modules, OPTIONS
            # ["MODULES"]): configured module names, never the stored path.
            autodiscover()
            task = task_registry.lookup(task_path)
        if task is None:
            raise TaskNotRegistered(
                f"task {task_path!r} is not registered in this process; define it with "
                "@task in an app's tasks module or a module listed in the backend's "
                "OPTIONS['MODULES']"
            )
        changes: dict[str, Any] = {
            "priority": snapshot.priority,
            "queue_name": snapshot.queue,
            "run_after": snapshot.initial_not_before,
            "backend": self.alias,
        }
        if isinstance(task, task_registry.JobsTask):
            changes["max_attempts"] = snapshot.max_attempts
        return replace(task, **changes)

    def job_scope(self) -> JobScope:
        """The reserved scope of this backend's task results (``OPTIONS["SCOPE"]``):
        no tenant's ``JobScope`` reaches them."""
        # What execution.reserved_scope returns; that module imports the schedules,
        # which import this backend's registry.
        from ..api import JobScope  # the models: see enqueue()

        return JobScope._reserved(self.scope)

    def _snapshot(self, result_id: object) -> JobSnapshot:
        if not isinstance(result_id, str):
            raise TaskResultDoesNotExist(result_id)
        try:
            snapshot = self.job_scope().get(result_id)
        except InvalidJobId:
            raise TaskResultDoesNotExist(result_id) from None
        if snapshot is None or snapshot.handler != HANDLER:
            raise TaskResultDoesNotExist(result_id)
        return snapshot

    # ------------------------------------------------------------------ cancel

    def cancel(self, result_id: str) -> CancelOutcome:
        """Cancel a task: a READY task fails at once as cancelled; a RUNNING one has
        its cancellation requested (it reaches ``context.job`` of a task that takes
        context, and the result is dropped). Says so if the task had finished."""
        snapshot = self._snapshot(result_id)
        try:
            return self.job_scope().cancel(snapshot.job_id)
        except JobNotFound:
            raise TaskResultDoesNotExist(result_id) from None

    async def acancel(self, result_id: str) -> CancelOutcome:
        """The async form of :meth:`cancel`."""
        return await sync_to_async(self.cancel, thread_sensitive=True)(result_id)
