"""django-ledon sagas: long business processes as persisted steps with compensations.

Its public names are imported on first use (see :mod:`ledon.lazy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledon.lazy import exported, lazy_attributes

if TYPE_CHECKING:  # for type checkers; ``as`` marks each name as re-exported
    from .api import compensate_saga as compensate_saga
    from .api import get_saga_instance as get_saga_instance
    from .api import resume_saga as resume_saga
    from .api import run_saga as run_saga
    from .api import start_saga as start_saga
    from .context import SagaContext as SagaContext
    from .exceptions import SagaConcurrencyError as SagaConcurrencyError
    from .exceptions import SagaError as SagaError
    from .exceptions import SagaExecutionError as SagaExecutionError
    from .exceptions import SagaIdentityConflict as SagaIdentityConflict
    from .registry import SagaDefinition as SagaDefinition
    from .registry import get_saga as get_saga
    from .registry import saga as saga
    from .types import SagaSnapshot as SagaSnapshot
    from .types import SagaStatus as SagaStatus

_LAZY = exported(
    {
        "api": ("compensate_saga", "get_saga_instance", "resume_saga", "run_saga", "start_saga"),
        "context": ("SagaContext",),
        "exceptions": (
            "SagaConcurrencyError",
            "SagaError",
            "SagaExecutionError",
            "SagaIdentityConflict",
        ),
        "registry": ("SagaDefinition", "get_saga", "saga"),
        "types": ("SagaSnapshot", "SagaStatus"),
    }
)
__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
