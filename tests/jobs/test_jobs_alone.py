"""jobs works alone: the core of the jobs suite, run in a pytest process of its own
with ``testproject.settings_jobs_only`` (no outbox, no sagas, none of the test
project's apps built on them), on the database this suite runs on.

``LEDON_JOBS_ALONE=versions`` (``scripts/test.sh`` sets it on the older CI legs) runs
the part of that core that goes through code which differs between Django and Python
versions: the tasks framework (``django.tasks`` or the ``django-tasks`` backport,
chosen in ``jobs.tasks_framework``, the only place jobs reads Django's version), used
by the backend and the schedules, and the worker command (threads and signals). The
rest of the core runs the same code on every leg; that it imports neither outbox nor
sagas on any branch is the import contracts' to say (``lint-imports``, which reads the
source, not one leg's run), and the whole core runs alone on the newest leg.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: The core of the jobs suite: submission, claiming, execution, scopes, retention,
#: the worker and its command, the testing helpers, the django.tasks backend and the
#: schedules.
CORE = [
    "tests/jobs/test_jobs_submit_stage.py",
    "tests/jobs/test_jobs_claiming.py",
    "tests/jobs/test_jobs_execution.py",
    "tests/jobs/test_jobs_identity.py",
    "tests/jobs/test_jobs_scope.py",
    "tests/jobs/test_jobs_bulk.py",
    "tests/jobs/test_jobs_retention.py",
    "tests/jobs/test_jobs_testing.py",
    "tests/jobs/test_jobs_unknown_handler.py",
    "tests/jobs/test_worker.py",
    "tests/jobs/test_run_jobs_command.py",
    "tests/jobs/test_tasks_backend.py",
    "tests/jobs/test_schedules_enqueue.py",
]

#: What of CORE runs through the code that differs between versions (the docstring).
VERSION_SENSITIVE = [
    "tests/jobs/test_tasks_backend.py",
    "tests/jobs/test_schedules_enqueue.py",
    "tests/jobs/test_run_jobs_command.py",
]

#: Tests of the core files that use the test project's shop app, absent here.
NEEDS_THE_SHOP = [
    # its handler 'test.record' is the shop's
    "tests/jobs/test_jobs_testing.py::test_a_fresh_process_finds_the_apps_handlers_without_importing_them",
]


def selected() -> list[str]:
    scope = os.environ.get("LEDON_JOBS_ALONE", "all")
    if scope not in ("all", "versions"):
        raise ValueError(f"LEDON_JOBS_ALONE={scope!r}: 'all' or 'versions'")
    return CORE if scope == "all" else VERSION_SENSITIVE


def test_the_version_sensitive_part_is_part_of_the_core():
    assert set(VERSION_SENSITIVE) <= set(CORE)


def test_the_core_of_the_jobs_suite_passes_without_outbox_and_sagas():
    files = selected()
    deselect = [arg for test in NEEDS_THE_SHOP for arg in ("--deselect", test)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            "-rA",  # every passed test by name in the summary
            "--ds",
            "testproject.settings_jobs_only",
            *deselect,
            *files,
            "tests/jobs/jobs_alone_checks.py",  # last: what the run imported
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=850,
        check=False,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in summary, summary
    assert "failed" not in summary, summary
    assert "error" not in summary, summary
    for check in (
        "test_neither_outbox_nor_sagas_is_installed",
        "test_nothing_the_jobs_suite_did_imported_outbox_or_sagas",
    ):
        assert f"PASSED tests/jobs/jobs_alone_checks.py::{check}" in done.stdout, done.stdout[
            -3000:
        ]
    for core in files:
        assert f"PASSED {core}::" in done.stdout, f"nothing of {core} ran"
