"""``@periodic``: schedules declared in code, next to their handlers.

A schedule names a handler (or a ``django.tasks`` task) and a timetable — a cron
expression in a time zone, or a fixed interval. Each period's run is an ordinary job
whose id names the period (``"{name}@{period start UTC}"``), so the job identity
makes it exactly one job per period however many workers race to enqueue it.

Everything is checked when the schedule is declared: a bad expression, an unknown
time zone, a duplicate name, both or neither of cron and ``every``, a bad
``catch_up`` or a payload that is not JSON raise :class:`~jobs.exceptions.InvalidSchedule`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, TypedDict, TypeVar, Unpack, overload
from zoneinfo import ZoneInfo

from ledon.naming import other_definition, qualified_name

from .. import tasks_framework, validation
from ..exceptions import InvalidInput, InvalidSchedule
from ..handlers import autodiscover, registered_handlers
from ..types import JobSubmission
from .timetable import CronTimetable, IntervalTimetable, TimetableError, job_id_time
from .types import CatchUp

__all__ = ["PeriodicOptions", "ScheduleSpec", "declared", "get", "periodic", "unregister"]

#: Longest schedule name: its job ids (``name@2026-12-01T05:00:00Z``) stay far below
#: the 200 characters of a job id.
MAX_NAME_LENGTH = 100

_Target = TypeVar("_Target")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """One declared schedule: its timetable and the job each period runs."""

    name: str
    #: The five cron fields (an alias already replaced), or "" for an interval.
    cron: str
    #: The interval in seconds, or 0 for a cron expression.
    every_seconds: int
    #: The IANA zone cron is evaluated in ("UTC" for intervals).
    timezone: str
    catch_up: CatchUp
    #: What each period's job runs; ``submission.initial_not_before`` is None here and
    #: set to the period's start in each job.
    submission: JobSubmission
    #: Where the schedule points, for people ("handler reports.daily@1", "task …").
    target: str
    timetable: CronTimetable | IntervalTimetable = field(compare=False, repr=False)

    @property
    def timetable_key(self) -> tuple[str, int, str]:
        """What decides the periods: (cron, every_seconds, timezone)."""
        return (self.cron, self.every_seconds, self.timezone)

    def describe(self) -> str:
        return self.timetable.describe()

    @property
    def expression(self) -> str:
        return self.cron or f"every {timedelta(seconds=self.every_seconds)}"

    def job_id(self, period: datetime) -> str:
        """The id of the job of the period starting at ``period``."""
        return f"{self.name}@{job_id_time(period)}"

    def manual_job_id(self, now: datetime) -> str:
        """The id of a run started by hand ("run now") at ``now``: never a period's."""
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return f"{self.name}@manual-{stamp}"

    def period_submission(self, period: datetime) -> JobSubmission:
        """The job of one period: the schedule's request, due from the period start."""
        return replace(self.submission, initial_not_before=period)


@dataclass(frozen=True, slots=True)
class _Pending:
    """A schedule on a function not yet registered as a handler (``@job_handler``
    stacked above ``@periodic``): resolved by :func:`declared`."""

    func: Callable[..., Any]
    build: Callable[[JobSubmission, str], ScheduleSpec]
    options: Mapping[str, Any]


_specs: dict[str, ScheduleSpec] = {}
_pending: dict[str, _Pending] = {}
_lock = threading.RLock()
_generation = 0


def generation() -> int:
    """A number that changes whenever a schedule is declared or removed."""
    return _generation


def _changed() -> None:
    global _generation
    _generation += 1


class PeriodicOptions(TypedDict, total=False):
    """The keyword options of :func:`periodic` besides ``name`` and ``handler``."""

    every: timedelta | None
    timezone: str | ZoneInfo | None
    version: int | None
    payload: Any
    args: Sequence[Any]
    kwargs: Mapping[str, Any] | None
    queue: str | None
    priority: int | None
    max_attempts: int | None
    catch_up: CatchUp | str


@overload
def periodic(
    cron: str | timedelta | None = None,
    *,
    name: str,
    handler: None = None,
    **options: Unpack[PeriodicOptions],
) -> Callable[[_Target], _Target]: ...


@overload
def periodic(
    cron: str | timedelta | None = None,
    *,
    name: str,
    handler: Any,
    **options: Unpack[PeriodicOptions],
) -> ScheduleSpec: ...


def periodic(
    cron: str | timedelta | None = None,
    *,
    name: str,
    handler: Any = None,
    **options: Unpack[PeriodicOptions],
) -> Any:
    """Declare a schedule named ``name``: run a job at every period of a timetable.

    The timetable is a five-field cron expression (or ``@hourly``, ``@daily``,
    ``@weekly``, ``@monthly``, ``@yearly``) evaluated in ``timezone`` (an IANA name,
    default ``"UTC"``), or ``every=timedelta(...)`` — whole seconds, anchored to the
    Unix epoch in UTC. A ``timedelta`` as the first argument means ``every``.

    As a decorator, stacked on ``@job_handler`` (either order) or on a ``django.tasks``
    ``@task``, it returns what it decorates. With ``handler=`` — a handler name (with
    ``version``) or a task object — it declares the schedule at once and returns its
    :class:`ScheduleSpec`. ``payload`` is the JSON payload of each handler job;
    ``args`` and ``kwargs`` are a task's arguments. ``queue``, ``priority`` and
    ``max_attempts`` default to the handler's defaults (the task's own values).
    ``catch_up`` is ``"latest"``, ``"all"`` or ``"skip"`` (see :class:`CatchUp`).

    Raises :class:`~jobs.exceptions.InvalidSchedule` for anything invalid.
    """
    unknown = sorted(set(options) - set(PeriodicOptions.__annotations__))
    if unknown:
        raise TypeError(f"periodic() got unexpected keyword argument(s): {', '.join(unknown)}")
    every = options.get("every")
    timezone = options.get("timezone")
    catch_up = options.get("catch_up", CatchUp.LATEST)
    label = name if isinstance(name, str) else repr(name)
    try:
        checked_name = validation.name(name, "schedule name", MAX_NAME_LENGTH)
        if isinstance(cron, timedelta):
            if every is not None:
                raise InvalidSchedule("give the interval once: as the first argument or every=")
            cron, every = None, cron
        if cron is not None and every is not None:
            raise InvalidSchedule("give a cron expression or every=, not both")
        if cron is None and every is None:
            raise InvalidSchedule("give a cron expression (e.g. '0 6 * * *') or every=timedelta(…)")
        timetable: CronTimetable | IntervalTimetable
        if cron is not None:
            timetable = CronTimetable.parse(cron, "UTC" if timezone is None else timezone)
        else:
            if timezone is not None:
                raise InvalidSchedule(
                    "every= runs on real time, anchored in UTC; timezone= applies to cron "
                    "expressions only"
                )
            timetable = IntervalTimetable.parse(every)
        if catch_up not in CatchUp.values:
            raise InvalidSchedule(
                f"catch_up must be one of {', '.join(CatchUp.values)}, not {catch_up!r}"
            )
    except (InvalidInput, TimetableError) as exc:
        raise InvalidSchedule(f"schedule {label!r}: {exc}") from exc
    except InvalidSchedule as exc:
        raise InvalidSchedule(f"schedule {label!r}: {exc}") from None

    def build(submission: JobSubmission, target: str) -> ScheduleSpec:
        return ScheduleSpec(
            name=checked_name,
            cron=timetable.expression if isinstance(timetable, CronTimetable) else "",
            every_seconds=timetable.seconds if isinstance(timetable, IntervalTimetable) else 0,
            timezone=timetable.zone_name if isinstance(timetable, CronTimetable) else "UTC",
            catch_up=CatchUp(catch_up),
            submission=submission,
            target=target,
            timetable=timetable,
        )

    if handler is not None:
        spec = _guarded(label, lambda: _spec_for(handler, options, build))
        return _register(spec)

    def decorator(target: _Target) -> _Target:
        resolved = _guarded(label, lambda: _resolve(target, options, build))
        if resolved is not None:
            _register(resolved)
        elif callable(target):
            _defer(checked_name, _Pending(target, build, options))
        else:
            raise InvalidSchedule(
                f"schedule {label!r}: @periodic decorates a handler function or a @task, "
                f"not {type(target).__name__}"
            )
        return target

    return decorator


def _guarded[T](label: str, make: Callable[[], T]) -> T:
    try:
        return make()
    except InvalidSchedule as exc:
        raise InvalidSchedule(f"schedule {label!r}: {exc}") from None
    except (InvalidInput, TypeError, ValueError) as exc:
        raise InvalidSchedule(f"schedule {label!r}: {exc}") from exc


def _spec_for(
    handler: Any, options: Mapping[str, Any], build: Callable[[JobSubmission, str], ScheduleSpec]
) -> ScheduleSpec:
    """The schedule of ``handler=``: a handler name, or a task object."""
    task = _as_task(handler)
    if task is not None:
        return _task_spec(task, options, build)
    if not isinstance(handler, str):
        raise InvalidSchedule(
            f"handler= takes a handler name or a @task, not {type(handler).__name__}"
        )
    return _handler_spec(handler, options.get("version") or 1, options, build)


def _resolve(
    target: Any, options: Mapping[str, Any], build: Callable[[JobSubmission, str], ScheduleSpec]
) -> ScheduleSpec | None:
    """The schedule of a decorated object, or None if it is a function that is not
    (yet) registered as a handler."""
    task = _as_task(target)
    if task is not None:
        return _task_spec(task, options, build)
    if not callable(target):
        return None
    handlers = [h for h in registered_handlers() if h.func is target]
    if len(handlers) > 1:
        found = ", ".join(f"{h.name}@{h.version}" for h in handlers)
        raise InvalidSchedule(
            f"the function is registered as several handlers ({found}); "
            "name one with periodic(..., handler=..., version=...)"
        )
    if handlers:
        version = options.get("version")
        if version is not None and version != handlers[0].version:
            raise InvalidSchedule(
                f"version={version} but the function is handler {handlers[0].name!r} "
                f"version {handlers[0].version}"
            )
        return _handler_spec(handlers[0].name, handlers[0].version, options, build)
    return None


def _handler_spec(
    name: str,
    version: int,
    options: Mapping[str, Any],
    build: Callable[[JobSubmission, str], ScheduleSpec],
) -> ScheduleSpec:
    if options.get("args") or options.get("kwargs"):
        raise InvalidSchedule("args= and kwargs= are a task's arguments; a handler takes payload=")
    submission = JobSubmission.create(
        name,
        options.get("payload"),
        version=version,
        queue=options.get("queue") or "default",
        priority=_or(options.get("priority"), 0),
        max_attempts=_or(options.get("max_attempts"), 1),
    )
    return build(submission, f"handler {name}@{version}")


def _task_spec(
    task: Any, options: Mapping[str, Any], build: Callable[[JobSubmission, str], ScheduleSpec]
) -> ScheduleSpec:
    """A task's period job is what ``JobsBackend.enqueue`` would store for it."""
    # Local: jobs.backends needs a tasks framework, which Django 5.2 has only with
    # the django-tasks backport; a task exists here, so the framework does.
    from ..backends.backend import JobsBackend
    from ..backends.compat import task_backends
    from ..backends.results import HANDLER, HANDLER_VERSION, TaskPayload

    if options.get("payload") is not None:
        raise InvalidSchedule("a task takes args= and kwargs=, not payload=")
    if options.get("version") is not None:
        raise InvalidSchedule("version= names a handler's version; a task has none")
    if not isinstance(task_backends[task.backend], JobsBackend):
        raise InvalidSchedule(
            f"task {task.module_path!r} uses TASKS[{task.backend!r}], which is not a "
            "jobs.backends.JobsBackend"
        )
    try:
        payload = TaskPayload.build(
            task, task.backend, options.get("args") or (), options.get("kwargs") or {}
        )
    except (TypeError, ValueError) as exc:
        raise InvalidSchedule(f"a task's args and kwargs must be JSON: {exc}") from exc
    submission = JobSubmission.create(
        HANDLER,
        payload.as_json(),
        version=HANDLER_VERSION,
        queue=options.get("queue") or task.queue_name,
        priority=_or(options.get("priority"), int(task.priority)),
        max_attempts=_or(options.get("max_attempts"), getattr(task, "max_attempts", 1)),
    )
    return build(submission, f"task {task.module_path}")


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _as_task(value: Any) -> Any:
    if not tasks_framework.available():  # Django 5.2 without the backport: no tasks
        return None
    from ..backends.compat import Task  # local: see _task_spec

    return value if isinstance(value, Task) else None


def _register(spec: ScheduleSpec) -> ScheduleSpec:
    with _lock:
        existing = _specs.get(spec.name)
        if existing is not None:
            if existing == spec:
                return existing  # the same declaration again (a module imported twice)
            raise InvalidSchedule(
                f"schedule {spec.name!r} is already declared ({existing.expression}, "
                f"{existing.target}); schedule names must be unique"
            )
        if spec.name in _pending:
            raise InvalidSchedule(f"schedule {spec.name!r} is already declared")
        _specs[spec.name] = spec
        _changed()
    return spec


def _defer(name: str, pending: _Pending) -> None:
    with _lock:
        if name in _specs or other_definition(_pending.get(name), pending.func) is not None:
            raise InvalidSchedule(
                f"schedule {name!r} is already declared; schedule names must be unique"
            )
        _pending[name] = pending
        _changed()


def declared() -> list[ScheduleSpec]:
    """Every schedule declared in this process, by name.

    Schedules whose function was registered as a handler after ``@periodic`` ran are
    resolved here; one whose function is still no handler or task raises
    :class:`~jobs.exceptions.InvalidSchedule`.
    """
    with _lock:
        for name, pending in list(_pending.items()):
            spec = _guarded(
                name, functools.partial(_resolve, pending.func, pending.options, pending.build)
            )
            if spec is None:
                raise InvalidSchedule(
                    f"schedule {name!r}: {qualified_name(pending.func)} is not a registered "
                    "@job_handler (for a django.tasks task, put @periodic above @task)"
                )
            del _pending[name]
            _specs[name] = spec
        return [_specs[name] for name in sorted(_specs)]


def get(name: str) -> ScheduleSpec | None:
    """The declared schedule of this name, if this process declares it."""
    return {spec.name: spec for spec in declared()}.get(name)


def unregister(name: str) -> None:
    """Forget a schedule (for tests); its stored row then shows as orphaned."""
    with _lock:
        if _specs.pop(name, None) is not None or _pending.pop(name, None) is not None:
            _changed()


@contextmanager
def isolated() -> Iterator[None]:
    """Run the block with no schedule declared; restore the declarations after."""
    with _lock:
        saved = (dict(_specs), dict(_pending))
        _specs.clear()
        _pending.clear()
        _changed()
    try:
        yield
    finally:
        with _lock:
            _specs.clear()
            _pending.clear()
            _specs.update(saved[0])
            _pending.update(saved[1])
            _changed()


_discovered = False


def discover() -> None:
    """Import what a worker imports (each app's tasks module, the task modules of the
    tasks backend), once per process, so that every schedule is declared here too."""
    global _discovered
    if not _discovered:
        autodiscover()
        _discovered = True
