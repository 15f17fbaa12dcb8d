"""The ``OPTIONS`` of a :class:`~jobs.backends.JobsBackend`, read and checked in one place.

``check_options`` turns every problem into a system check message with a stable id
(``jobs.E1xx``); ``backend_options`` returns the parsed values or raises the first
problem as a configuration error, so a bad setting never half-works.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any

from django.apps import apps
from django.core import checks

from ledon.conf import settings_hint, unknown_keys_message

from .. import validation
from ..exceptions import InvalidInput, JobsConfigurationError

#: The scope of the jobs that back task results, unless ``OPTIONS["SCOPE"]`` says otherwise.
DEFAULT_SCOPE = "django.tasks"
KNOWN_OPTIONS = ("SCOPE", "MODULES")

E_OPTIONS_TYPE = "jobs.E101"
E_UNKNOWN_OPTION = "jobs.E102"
E_SCOPE = "jobs.E103"
E_MODULES_TYPE = "jobs.E104"
E_MODULE_IMPORT = "jobs.E105"
E_QUEUE_NAME = "jobs.E106"
E_APP_NOT_INSTALLED = "jobs.E107"


@dataclass(frozen=True, slots=True)
class BackendOptions:
    #: Every task result of the backend is a job of this reserved scope
    #: (``execution.reserved_scope(scope)``; no tenant's ``JobScope`` reaches it).
    scope: str
    #: Modules the worker imports so that the ``@task`` functions they define run.
    modules: tuple[str, ...]


def _error(alias: str, message: str, hint: str, check_id: str) -> checks.Error:
    return checks.Error(f"TASKS[{alias!r}]: {message}", hint=hint, id=check_id)


def _parse(
    alias: str, options: object, queues: Iterable[str], *, import_modules: bool
) -> tuple[BackendOptions, list[checks.CheckMessage]]:
    problems: list[checks.CheckMessage] = []
    if isinstance(options, Mapping):
        values: Mapping[Any, Any] = options
    else:
        problems.append(
            _error(
                alias,
                f"OPTIONS must be a dict, not {type(options).__name__}",
                'Write OPTIONS as {"SCOPE": "...", "MODULES": [...]}.',
                E_OPTIONS_TYPE,
            )
        )
        values = {}
    unknown = sorted(str(key) for key in values if key not in KNOWN_OPTIONS)
    if unknown:
        problems.append(
            _error(
                alias,
                unknown_keys_message("OPTIONS key(s)", unknown, KNOWN_OPTIONS),
                f"The options of JobsBackend are: {', '.join(KNOWN_OPTIONS)}. "
                + settings_hint("TASKS"),
                E_UNKNOWN_OPTION,
            )
        )

    scope: Any = values.get("SCOPE", DEFAULT_SCOPE)
    try:
        validation.scope_hash(scope)
    except InvalidInput as exc:
        problems.append(
            _error(
                alias,
                f"OPTIONS['SCOPE'] is not a valid scope: {exc}",
                "Use a non-empty string, e.g. the default 'django.tasks'.",
                E_SCOPE,
            )
        )
        scope = DEFAULT_SCOPE

    modules: Any = values.get("MODULES", ())
    if isinstance(modules, str) or not isinstance(modules, list | tuple):
        problems.append(
            _error(
                alias,
                "OPTIONS['MODULES'] must be a list of dotted module paths",
                'For example ["myapp.background"].',
                E_MODULES_TYPE,
            )
        )
        modules = ()
    elif not all(isinstance(m, str) and m for m in modules):
        problems.append(
            _error(
                alias,
                "every entry of OPTIONS['MODULES'] must be a non-empty module path",
                'For example ["myapp.background"].',
                E_MODULES_TYPE,
            )
        )
        modules = ()
    elif import_modules:
        for module in modules:
            try:
                import_module(module)
            except ImportError as exc:
                problems.append(
                    _error(
                        alias,
                        f"OPTIONS['MODULES'] names {module!r}, which cannot be imported: {exc}",
                        "List modules that define @task functions for this backend.",
                        E_MODULE_IMPORT,
                    )
                )

    for queue in sorted(queues):
        try:
            validation.name(queue, "queue", validation.MAX_QUEUE_LENGTH)
        except InvalidInput as exc:
            problems.append(
                _error(
                    alias,
                    f"QUEUES contains a name the job store cannot use: {exc}",
                    "Queue names use letters, digits and _ . : - (at most 100 characters).",
                    E_QUEUE_NAME,
                )
            )

    return BackendOptions(scope=scope, modules=tuple(modules)), problems


def check_options(alias: str, options: object, queues: Iterable[str]) -> list[checks.CheckMessage]:
    """Every problem of the backend's configuration, as system check messages."""
    _, problems = _parse(alias, options, queues, import_modules=True)
    if not apps.is_installed("jobs"):
        problems.append(
            _error(
                alias,
                "jobs.backends.JobsBackend stores tasks as jobs, but the 'jobs' app "
                "is not installed",
                "Add 'jobs' to INSTALLED_APPS and run migrate.",
                E_APP_NOT_INSTALLED,
            )
        )
    return problems


def backend_options(alias: str, options: object, queues: Iterable[str]) -> BackendOptions:
    """The parsed options; :class:`~jobs.exceptions.JobsConfigurationError` if any is bad."""
    parsed, problems = _parse(alias, options, queues, import_modules=False)
    if problems:
        raise JobsConfigurationError(problems[0].msg)
    return parsed
