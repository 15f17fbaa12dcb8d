"""System check of the declared schedules (``jobs.E004``): each names a handler this
process registers, so that a misspelt ``@periodic(handler=...)`` is found by
``manage.py check`` instead of by a period job that no worker can run."""

from __future__ import annotations

from typing import Any

from django.core import checks

from ledon.checks import ENGINES
from ledon.naming import closest

from ..exceptions import InvalidSchedule, JobsConfigurationError, UnknownHandler
from ..handlers import autodiscover, get_handler, registered_handlers
from . import declarations


@checks.register(ENGINES)
def check_schedule_handlers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``jobs.E004``: a declared schedule whose handler (name and version) is not
    registered once the apps' tasks modules are imported, as a worker imports them."""
    try:
        autodiscover()
    except JobsConfigurationError:
        # A bad setting stops the discovery; its own check reports it, and the
        # handlers cannot be known until it is fixed.
        return []
    try:
        specs = declarations.declared()
    except InvalidSchedule as exc:
        return [checks.Error(str(exc), id="jobs.E004")]
    names = sorted({spec.name for spec in registered_handlers()})
    errors: list[checks.CheckMessage] = []
    for spec in specs:
        handler, version = spec.submission.handler, spec.submission.handler_version
        try:
            get_handler(handler, version)
        except UnknownHandler as exc:
            close = closest(handler, names)
            meant = f" Did you mean {close!r}?" if close is not None else ""
            errors.append(
                checks.Error(
                    f"schedule {spec.name!r} runs handler {handler!r} version {version}, "
                    f"which is not registered: {exc}",
                    hint="Name a handler registered with @job_handler (or a task) in an "
                    f"app's tasks module.{meant}",
                    obj=spec.name,
                    id="jobs.E004",
                )
            )
    return errors
