"""Adapters of the systems under test, by name (imported lazily: each imports its
library only when it is measured)."""

from __future__ import annotations

from importlib import import_module

from .base import System, WorkerConfig

ADAPTERS = {
    "django-ledon": ("benchmarks.systems.ledon", "Ledon"),
    "pgqueuer": ("benchmarks.systems.pgqueuer", "Pgqueuer"),
    "procrastinate": ("benchmarks.systems.procrastinate", "Procrastinate"),
    "django-tasks-db": ("benchmarks.systems.django_tasks_db", "DjangoTasksDb"),
}
OURS = "django-ledon"
PEERS = [name for name in ADAPTERS if name != OURS]


def adapter(name: str) -> type[System]:
    module, cls = ADAPTERS[name]
    system: type[System] = getattr(import_module(module), cls)
    return system


__all__ = ["ADAPTERS", "OURS", "PEERS", "System", "WorkerConfig", "adapter"]
