"""What a ``run_jobs --burst`` on an empty queue loads, in a fresh process: the worker's
modules, not the admin's bulk operations, the reads of why a job waits, the scoped
API's batches nor — in a project without sagas — the saga runner. Each was part of
every worker's start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import ROOT

pytestmark = pytest.mark.slow

#: Modules a worker with nothing to run has no use for.
NOT_LOADED = (
    "ledon.bulk",
    "jobs.store.scoped",
    "jobs.store.waiting",
    "jobs.store.batches",
    "jobs.api",
    "sagas.runner",
)

SETTINGS = """
SECRET_KEY = "x"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "jobs", "outbox", "sagas"]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": {name!r}}}}}
"""

RUN = """
import json, sys
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", "run_jobs", "--burst", "-v", "0"])
print(json.dumps(sorted(name for name in sys.modules if name.startswith({prefixes!r}))))
"""


def _python(tmp_path: Path, *args: str) -> str:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "worker_start_up_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    env.pop("DATABASE_URL", None)
    done = subprocess.run(
        [sys.executable, *args], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_burst_worker_on_an_empty_queue_loads_only_what_it_uses(tmp_path: Path) -> None:
    (tmp_path / "worker_start_up_settings.py").write_text(
        SETTINGS.format(name=str(tmp_path / "db.sqlite3"))
    )
    _python(tmp_path, "-m", "django", "migrate", "-v", "0")
    prefixes = ("jobs", "ledon", "outbox", "sagas")
    loaded = json.loads(_python(tmp_path, "-c", RUN.format(prefixes=prefixes)).splitlines()[-1])
    assert "jobs.worker.engine" in loaded  # the worker ran
    assert [name for name in NOT_LOADED if name in loaded] == []
