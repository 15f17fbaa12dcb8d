"""Definitions: ``@workflow`` bodies by (name, version) and ``@activity`` functions
by name.

Both are found like job handlers: each installed app's tasks module
(``JOBS["AUTODISCOVER_MODULE"]``) declares them, and the registry imports those
modules the first time a name is missing. Stored data never names a path to import;
a run names its (name, version), an item job its activity's name. An activity is
also a job handler of its own name (version 1), so the jobs' per-handler limits
(given to ``@activity``) and per-queue limits apply to its items, and it stays
callable as a plain function.

The registry only records: who acts on a new activity (the app's config registers
its job handler) watches it through :func:`watch_activities`, so that the registry
imports nothing that runs workflows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from django.utils.module_loading import autodiscover_modules

from jobs.conf import jobs_settings
from ledon.naming import did_you_mean, other_definition, qualified_name

from . import validation
from .exceptions import InvalidWorkflow, UnknownActivity, UnknownWorkflow

P = ParamSpec("P")
R = TypeVar("R")
#: A workflow body: ``fn(wf)``, ``wf`` the run's ``WorkflowContext`` (named here only
#: as its role: the registry imports nothing that runs workflows).
Body = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    name: str
    version: int
    func: Body
    #: Seconds from a run's creation to its deadline (None: none; see ``@workflow``).
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class ActivitySpec:
    name: str
    func: Callable[..., Any]
    #: Tries after the first before the item fails.
    retries: int
    #: Seconds a try may run before it is signalled to stop (None: no limit).
    timeout: float | None
    queue: str
    #: Its item jobs' limits across every worker (see ``@job_handler``).
    max_running: int | None = None
    max_running_per_scope: int | None = None
    rate: tuple[int, float] | None = None


_workflows: dict[tuple[str, int], WorkflowSpec] = {}
_activities: dict[str, ActivitySpec] = {}
#: Called with every activity registered (see :func:`watch_activities`).
_watchers: list[Callable[[ActivitySpec], None]] = []
_lock = threading.Lock()
_discovered = False


def workflow(
    name: str, *, version: int = 1, timeout: float | None = None
) -> Callable[[Body], Body]:
    """Register ``fn(wf: WorkflowContext)`` as the body of workflow ``name`` at
    ``version``; its JSON return value is the run's output.

    ``timeout``: seconds from a run's creation after which, if it has not finished,
    it ends Cancelled with ``RunTimedOut`` (``start_workflow(timeout=...)`` overrides
    it for one run).

    A second, different definition of the same (name, version) is
    :class:`~workflows.exceptions.InvalidWorkflow`; the same function registered again
    (its module imported twice) keeps one.
    """
    validation.name(name, "workflow name", error=InvalidWorkflow)
    validation.version(version, f"workflow {name!r}: version", error=InvalidWorkflow)
    seconds = (
        None
        if timeout is None
        else validation.seconds(timeout, f"workflow {name!r}: timeout", error=InvalidWorkflow)
    )

    def decorator(func: Body) -> Body:
        if not callable(func):
            raise InvalidWorkflow(f"workflow {name!r} must decorate a function")
        with _lock:
            other = other_definition(_workflows.get((name, version)), func)
            if other is not None:
                raise InvalidWorkflow(
                    f"workflow {name!r} version {version} is defined twice: "
                    f"{other} and {qualified_name(func)}"
                )
            _workflows[(name, version)] = WorkflowSpec(name, version, func, seconds)
        return func

    return decorator


def activity(
    name: str,
    *,
    retries: int = 0,
    timeout: float | None = None,
    queue: str | None = None,
    max_running: int | None = None,
    max_running_per_scope: int | None = None,
    rate: tuple[int, float] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Register ``fn`` (JSON arguments in, JSON result out) as activity ``name``.

    ``wf.step(key, fn, ...)`` runs it as one job on any worker and ``wf.map(key, fn,
    items)`` as one job per item, on ``queue`` (default: ``"default"``), each tried
    ``1 + retries`` times with back-off: the job's attempts, so a failed try is a
    failed attempt with its error. ``timeout`` signals a try to stop (through its
    job's context) after that many seconds; the try then fails. A try records its
    item only while its job's attempt is current: one that returns after its attempt
    ended (past its timeout, or its lease recovered by another worker) records
    nothing. ``max_running``, ``max_running_per_scope`` and ``rate=(count, seconds)``
    limit its item jobs across every worker, as ``@job_handler``'s do. The function
    itself is returned unchanged: it stays callable as a plain function.
    """
    validation.name(name, "activity name", error=InvalidWorkflow)
    validation.retries(retries, f"activity {name!r}", error=InvalidWorkflow)
    seconds = (
        None
        if timeout is None
        else validation.seconds(timeout, f"activity {name!r}: timeout", error=InvalidWorkflow)
    )
    queue_name = validation.name(queue or "default", "queue", error=InvalidWorkflow)

    def decorator(func: Callable[P, R]) -> Callable[P, R]:
        spec = ActivitySpec(
            name,
            func,
            retries,
            seconds,
            queue_name,
            max_running,
            max_running_per_scope,
            rate,
        )
        with _lock:
            existing = _activities.get(name)
            other = other_definition(existing, func)
            if other is not None:
                raise InvalidWorkflow(
                    f"activity {name!r} is defined twice: {other} and {qualified_name(func)}"
                )
            _activities[name] = spec
            watchers = list(_watchers)
        try:
            for watcher in watchers:
                watcher(spec)
        except InvalidWorkflow:
            with _lock:
                if existing is None:
                    _activities.pop(name, None)
            raise
        func.__workflow_activity__ = name  # type: ignore[attr-defined]
        return func

    return decorator


def watch_activities(watcher: Callable[[ActivitySpec], None]) -> None:
    """Call ``watcher(spec)`` for every activity registered so far, and for each one
    registered from now on, before its ``@activity`` returns: an
    :class:`~workflows.exceptions.InvalidWorkflow` it raises is that declaration's
    error, and the activity is not registered. The same watcher twice is called once."""
    with _lock:
        if watcher in _watchers:
            return
        _watchers.append(watcher)
        known = list(_activities.values())
    for spec in known:
        watcher(spec)


def autodiscover() -> None:
    """Import ``<app>.<JOBS["AUTODISCOVER_MODULE"]>`` of every installed app."""
    global _discovered
    autodiscover_modules(jobs_settings().AUTODISCOVER_MODULE)
    _discovered = True


def _discover_once() -> None:
    if not _discovered:
        autodiscover()


def find_workflow(name: str, version: int) -> WorkflowSpec | None:
    """The registered (name, version), or None (a worker without that version)."""
    spec = _workflows.get((name, version))
    if spec is None and not _discovered:
        _discover_once()
        spec = _workflows.get((name, version))
    return spec


def get_workflow(name: object, version: object = None) -> WorkflowSpec:
    """The registered workflow; ``version=None``: its highest registered version.

    Raises :class:`~workflows.exceptions.UnknownWorkflow`.
    """
    checked = validation.name(name, "workflow name", error=InvalidWorkflow)
    asked = (
        None if version is None else validation.version(version, "version", error=InvalidWorkflow)
    )
    for attempt in range(2):
        versions = sorted(v for (n, v) in _workflows if n == checked)
        chosen = versions[-1] if asked is None and versions else asked
        if chosen is not None and (checked, chosen) in _workflows:
            return _workflows[(checked, chosen)]
        if attempt == 0 and not _discovered:
            _discover_once()
            continue
        known = (
            f" (registered versions: {versions})"
            if versions
            else did_you_mean(checked, {n for n, _v in list(_workflows)})
        )
        what = f"{checked!r}" if asked is None else f"{checked!r} version {asked}"
        raise UnknownWorkflow(f"no workflow registered as {what}{known}")
    raise AssertionError("unreachable")


def get_activity(name: str) -> ActivitySpec:
    """The registered activity, or :class:`~workflows.exceptions.UnknownActivity`."""
    spec = _activities.get(name)
    if spec is None and not _discovered:
        _discover_once()
        spec = _activities.get(name)
    if spec is None:
        meant = did_you_mean(name, list(_activities)) if isinstance(name, str) else ""
        raise UnknownActivity(f"no activity registered as {name!r}{meant}")
    return spec


def activity_of(func: object) -> ActivitySpec | None:
    """The activity ``func`` was registered as, or None for a plain function."""
    name = getattr(func, "__workflow_activity__", None)
    return _activities.get(name) if isinstance(name, str) else None


def registered_workflows() -> list[WorkflowSpec]:
    _discover_once()
    return sorted(_workflows.values(), key=lambda s: (s.name, s.version))


def unregister_workflow(name: str, version: int) -> None:
    """Remove a registration (for tests)."""
    with _lock:
        _workflows.pop((name, version), None)
