"""Django settings for benchmark processes: the three apps, the no-op handler and, when
installed, the django-tasks database backend — none of the test project's apps, so
that the numbers measure the queues.

``DATABASE_URL`` must point at PostgreSQL (the harness sets it).
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

import environ

SECRET_KEY = "benchmarks-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# A django-ledon worker process (BENCH_LEDON_WORKER) leaves the peer's app out: its
# start-up and CPU per job are then this project's alone (django-tasks-db imports the
# admin and the typing stubs' patches when it loads).
HAS_DJANGO_TASKS_DB = importlib.util.find_spec(
    "django_tasks_db"
) is not None and not os.environ.get("BENCH_LEDON_WORKER")

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "jobs",
    "outbox",
    "sagas",
    "benchmarks",
]
if HAS_DJANGO_TASKS_DB:
    INSTALLED_APPS.append("django_tasks_db")

_db: dict[str, Any] = environ.Env.db_url_config(os.environ["DATABASE_URL"])
# Persistent connections for every Django-based system (the peer's faster setting).
_db["CONN_MAX_AGE"] = None
DATABASES = {"default": _db}

JOBS: dict[str, Any] = {}
# Variants of the worker's settings (the harness: look-ahead, asynchronous commit, queue
# limits).
if os.environ.get("BENCH_JOBS"):
    JOBS.update(json.loads(os.environ["BENCH_JOBS"]))

OUTBOX: dict[str, Any] = {"ENABLED": True, "TRANSPORT": "in-process"}

TASKS: dict[str, Any] = (
    {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}} if HAS_DJANGO_TASKS_DB else {}
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
