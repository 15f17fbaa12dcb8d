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

#: The job store's flow rules a task passes through to its jobs.
RULES = (
    "start_within",
    "limit_key",
    "unique_key",
    "unique_while",
    "unique_for",
    "debounce",
    "debounce_max",
)


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
    #: Seconds after the enqueue by which it must start, or it ends failed (expired).
    start_within: float | None = None
    #: The key the job store's ``max_running_per_key`` counts its jobs under.
    limit_key: str | None = None
    #: The flow rules of the job store (``docs/flow-control.md``), for ``using()``:
    #: one job per key while it is queued (or active, or for a time), a debounce.
    unique_key: str | None = None
    unique_while: str | None = None
    unique_for: float | None = None
    debounce: float | None = None
    debounce_max: float | None = None

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | None = None,
        backend: str | None = None,
        max_attempts: int | None = None,
        **rules: Any,
    ) -> JobsTask:
        """Django's ``Task.using``, which also accepts ``max_attempts`` and the job
        store's flow rules (:data:`RULES`: ``start_within``, ``limit_key``, ``unique_key``,
        ``unique_while``, ``unique_for``, ``debounce``, ``debounce_max``)."""
        unknown = sorted(set(rules) - set(RULES))
        if unknown:
            raise TypeError(f"using() got unexpected keyword argument(s) {', '.join(unknown)}")
        # Explicit base call: zero-argument super() does not work in slotted dataclasses.
        task = cast(
            JobsTask,
            Task.using(
                self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
            ),
        )
        if max_attempts is not None:
            task = replace(task, max_attempts=max_attempts)
        if rules:
            task = replace(task, **rules)
        return task

    def submit_rules(self) -> dict[str, Any]:
        """The flow rules this task's jobs are submitted with (keywords of
        ``JobSubmission.create``)."""
        return {name: getattr(self, name) for name in RULES if getattr(self, name) is not None}

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
