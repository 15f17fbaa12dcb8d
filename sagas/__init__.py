"""django-ledon sagas: long business processes as persisted steps with compensations.

Names are imported lazily so that listing ``"sagas"`` in ``INSTALLED_APPS`` never
imports models before the app registry is ready.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import lazy_attributes

if TYPE_CHECKING:
    from .api import compensate_saga, get_saga_instance, resume_saga, run_saga, start_saga
    from .context import SagaContext
    from .exceptions import SagaConcurrencyError, SagaError, SagaExecutionError
    from .registry import SagaDefinition, get_saga, saga
    from .types import SagaSnapshot, SagaStatus

__all__ = [
    "SagaConcurrencyError",
    "SagaContext",
    "SagaDefinition",
    "SagaError",
    "SagaExecutionError",
    "SagaSnapshot",
    "SagaStatus",
    "compensate_saga",
    "get_saga",
    "get_saga_instance",
    "resume_saga",
    "run_saga",
    "saga",
    "start_saga",
]

_LAZY = {
    "compensate_saga": "api",
    "get_saga_instance": "api",
    "resume_saga": "api",
    "run_saga": "api",
    "start_saga": "api",
    "SagaContext": "context",
    "SagaConcurrencyError": "exceptions",
    "SagaError": "exceptions",
    "SagaExecutionError": "exceptions",
    "SagaDefinition": "registry",
    "get_saga": "registry",
    "saga": "registry",
    "SagaSnapshot": "types",
    "SagaStatus": "types",
}

__getattr__ = lazy_attributes(__name__, _LAZY)
