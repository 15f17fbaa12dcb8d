"""Django settings of the workflow benchmarks: the benchmark settings plus the
workflows app and the benchmark's workflows."""

from __future__ import annotations

from .settings import *  # noqa: F403
from .settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "workflows", "benchmarks.wfapp"]
