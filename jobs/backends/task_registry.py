"""The task class of the backend and the registry of tasks known to this process.

Every task the backend validates (``Task.__post_init__`` calls ``validate_task`` when
``@task`` runs) is recorded here under its module path. A worker runs a task only if
it finds it here: the module path stored with a job is a key for this lookup and is
never imported.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, cast

from django.utils.module_loading import import_string

from ..handlers import JobContext, RetryPolicy
from .compat import Task, TaskContext


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsTask(Task):  # type: ignore[type-arg]
    """A task of :class:`~jobs.backends.JobsBackend`: Django's ``Task`` plus retries.

    ``@task(max_attempts=3, retry=RetryPolicy(base_delay=5))`` lets a failing task
    run again, up to ``max_attempts`` executions in all, after an exponential backoff
    (``retry``; default: the ``JOBS`` retry settings).
    """

    #: Executions at most, the first included; 1 means no automatic retry.
    max_attempts: int = 1
    #: Backoff between attempts and which exceptions are retried.
    retry: RetryPolicy | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        max_attempts: int | None = None,
    ) -> JobsTask:
        """Django's ``Task.using``, which also accepts ``max_attempts``."""
        # Explicit base call: zero-argument super() does not work in slotted dataclasses.
        task = cast(
            JobsTask,
            Task.using(
                self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
            ),
        )
        if max_attempts is not None:
            task = replace(task, max_attempts=max_attempts)
        return task

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle by reference to the module-level task, as Django 6 pickles a
        ``Task`` (the Django 5.2 backport cannot), so that a task pickles the same
        way on every supported Django."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["func"] = self.module_path
        return (_unpickle_task, (type(self), values))


def _unpickle_task(cls: type[JobsTask], values: dict[str, Any]) -> JobsTask:
    path = values["func"]
    try:
        defined = import_string(path)
        values["func"] = defined.func
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"Expected {path!r} to point to a Task instance.") from exc
    return cls(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobsTaskContext(TaskContext):  # type: ignore[type-arg, misc]
    """Django's ``TaskContext`` plus ``job``: the running attempt's
    :class:`~jobs.JobContext` (progress reporting and the cancellation signal)."""

    job: JobContext


_tasks: dict[str, Task[..., Any]] = {}
_lock = threading.Lock()


def register(task: Task[..., Any]) -> None:
    """Record ``task`` under its module path.

    The first definition of a function is kept (variants made by ``using()`` share
    it); a different function object under the same path (a reloaded module)
    replaces it.
    """
    path = task.module_path
    with _lock:
        known = _tasks.get(path)
        if known is None or known.func is not task.func:
            _tasks[path] = task


def lookup(module_path: str) -> Task[..., Any] | None:
    """The registered task with this module path, if this process defined it."""
    return _tasks.get(module_path)


def unregister(module_path: str) -> None:
    """Forget a task (for tests)."""
    with _lock:
        _tasks.pop(module_path, None)
