"""The tasks run by the django-tasks database backend (a peer under test): a no-op
and the 5 ms one."""

from __future__ import annotations

import time

from django.tasks import task

from . import probe, work


@task()
def noop(n: int) -> None:
    probe.started(n)


@task()
def sleep5(n: int) -> None:
    time.sleep(work.SLEEP_SECONDS)
