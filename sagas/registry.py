"""Saga definitions, registered by name.

::

    saga("order-fulfillment") \\
        .step("reserve", reserve, compensate=release) \\
        .step("charge", charge, compensate=refund) \\
        .step("ship", ship)

``saga(name)`` registers the definition at once, and each ``.step()`` adds to it, so
a module-level chain is complete when its module has been imported. Django imports
each installed app's ``sagas`` module (``SAGAS["AUTODISCOVER_MODULE"]``) when it starts,
so every process — web, ``recover_sagas``, a shell — can run or recover any saga by its
name. Stored instances name their saga and steps; code is never imported from a path
read from the database.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.utils.module_loading import autodiscover_modules

from . import validation
from .conf import sagas_settings
from .exceptions import InvalidSagaDefinition, SagaDefinitionMismatch, UnknownSaga

if TYPE_CHECKING:
    from .context import SagaContext

logger = logging.getLogger(__name__)

#: A step's action or compensation: takes the context, returns nothing.
StepFunction = Callable[["SagaContext"], None]


@dataclass(frozen=True, slots=True)
class SagaStep:
    """One step: its action, optional compensation and optional timeout (seconds)."""

    name: str
    action: StepFunction
    compensate: StepFunction | None = None
    timeout: float | None = None


def _check_function(value: object, what: str) -> StepFunction:
    if not callable(value):
        raise InvalidSagaDefinition(f"{what} must be callable, got {value!r}")
    if inspect.iscoroutinefunction(value):
        raise InvalidSagaDefinition(
            f"{what} is an async function; saga steps are plain functions (each runs "
            "on a thread of its own)"
        )
    return value


class SagaDefinition:
    """A saga: its name and ordered steps. Built by :func:`saga` and ``.step()``."""

    def __init__(self, name: str) -> None:
        self.name = validation.saga_name(name)
        #: The module that defined it (set by :func:`saga`).
        self.module = ""
        self._steps: tuple[SagaStep, ...] = ()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<SagaDefinition {self.name!r} steps={list(self.step_names)}>"

    def step(
        self,
        name: str,
        action: StepFunction,
        compensate: StepFunction | None = None,
        timeout: float | None = None,
    ) -> SagaDefinition:
        """Add a step and return the definition (so calls chain).

        ``action(ctx)`` does the step's work; ``compensate(ctx)`` undoes it when a
        later step fails (``None``: nothing can undo it; a warning is logged when it
        would be needed). ``timeout`` overrides ``SAGAS["STEP_TIMEOUT"]`` for this step.
        """
        name = validation.step_name(name)
        step = SagaStep(
            name=name,
            action=_check_function(action, f"step {name!r}: the action"),
            compensate=(
                None
                if compensate is None
                else _check_function(compensate, f"step {name!r}: the compensation")
            ),
            timeout=validation.timeout(timeout, f"step {name!r}: the timeout"),
        )
        with self._lock:
            if any(s.name == name for s in self._steps):
                raise InvalidSagaDefinition(f"saga {self.name!r} already has a step {name!r}")
            self._steps = (*self._steps, step)
        return self

    @property
    def steps(self) -> tuple[SagaStep, ...]:
        return self._steps

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self._steps)

    def get_step(self, name: str) -> SagaStep:
        for step in self._steps:
            if step.name == name:
                return step
        raise SagaDefinitionMismatch(
            f"saga {self.name!r} has no step {name!r} any more (its steps are "
            f"{list(self.step_names)})"
        )

    def check_plan(self, steps: tuple[str, ...] | list[str]) -> None:
        """Raise :class:`SagaDefinitionMismatch` unless every stored step name exists."""
        missing = [s for s in steps if s not in self.step_names]
        if missing:
            raise SagaDefinitionMismatch(
                f"saga {self.name!r} no longer defines step(s) {missing} that the stored "
                f"instance was started with (current steps: {list(self.step_names)}); "
                "the instance is left untouched"
            )


_registry: dict[str, SagaDefinition] = {}
_registry_lock = threading.Lock()


def saga(name: str) -> SagaDefinition:
    """Define and register the saga ``name``; add its steps with ``.step()``.

    Defining a name again replaces the earlier definition (tests often do). When the
    two definitions come from different modules, that is almost always two sagas
    sharing a name by mistake, so a warning names both modules.
    """
    definition = SagaDefinition(name)
    # The module whose top level (or function) called saga(): where the saga lives.
    definition.module = sys._getframe(1).f_globals.get("__name__", "")
    with _registry_lock:
        existing = _registry.get(name)
        _registry[name] = definition
    if existing is not None and existing.module != definition.module:
        logger.warning(
            "saga %r defined in %s replaces the one defined in %s; saga names must be "
            "unique, or recovery runs whichever definition was imported last",
            name,
            definition.module,
            existing.module,
            extra={"saga": name},
        )
    return definition


def get_saga(name: str) -> SagaDefinition:
    """The registered definition of ``name``, or :class:`UnknownSaga`."""
    definition = _registry.get(name)
    if definition is None:
        raise UnknownSaga(
            f"no saga is registered as {name!r}; define it in a module this process "
            "imports (SAGAS['AUTODISCOVER_MODULE'], by default <app>/sagas.py)"
        )
    return definition


def registered_sagas() -> list[SagaDefinition]:
    with _registry_lock:
        return sorted(_registry.values(), key=lambda d: d.name)


def unregister(name: str) -> None:
    """Remove a registration (for tests)."""
    with _registry_lock:
        _registry.pop(name, None)


def autodiscover() -> None:
    """Import ``<app>.<AUTODISCOVER_MODULE>`` for every installed app."""
    module = sagas_settings().AUTODISCOVER_MODULE
    if module:
        autodiscover_modules(module)
