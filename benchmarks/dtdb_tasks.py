"""The no-op task run by the django-tasks database backend (a peer under test)."""

from __future__ import annotations

from django.tasks import task

from . import probe


@task()
def noop(n: int) -> None:
    probe.started(n)
