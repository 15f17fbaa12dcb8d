"""Mistakes at start-up with ``workflows`` installed: each is said in a line or two
that names the fix, never a traceback — a misspelt ``JOBS`` key is ``jobs.E001`` in
``check``, ``migrate`` and ``run_jobs``; a worker whose database lacks the workflows'
tables refuses to start, naming ``migrate``."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.apps import apps
from django.core import checks
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings

from jobs import JobScope, JobStatus, JobSubmission, submit_job
from jobs.worker import Worker
from ledon.db import DatabaseNotMigrated
from tests.support.procs import ManageProcess, settings_module
from workflows import registry, start_workflow, upkeep

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]
SCOPE = "tenant-start-up"
WORKFLOWS_TABLES = ", ".join(
    m._meta.db_table for m in apps.get_app_config("workflows").get_models()
)


def test_a_misspelt_jobs_key_is_jobs_e001_while_runs_are_in_flight(monkeypatch) -> None:
    """The in-flight versions check finds the definitions through
    ``JOBS["AUTODISCOVER_MODULE"]``: a bad JOBS setting is jobs.E001's to report."""
    start_workflow(SCOPE, "in-flight", "checks.linear", {"start": 1})
    monkeypatch.setattr(registry, "_discovered", False)  # as in a fresh process
    with override_settings(JOBS={"LEASE_SECOND": 30}):
        found = checks.run_checks()
    errors = [(m.id, m.msg) for m in found if m.level >= checks.ERROR]
    assert errors == [
        ("jobs.E001", "unknown JOBS setting(s): LEASE_SECOND (did you mean 'LEASE_SECONDS'?)")
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", [("check",), ("migrate",), ("run_jobs", "--burst")], ids=lambda c: c[0]
)
def test_every_command_reports_a_misspelt_jobs_key_without_a_traceback(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    start_workflow(SCOPE, "in-flight", "checks.linear", {"start": 1})
    (tmp_path / "misspelt_jobs.py").write_text(
        f"from {settings_module()} import *  # noqa: F403\n"
        "JOBS = {**JOBS, 'LEASE_SECOND': 30}  # noqa: F405\n"
    )
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    process = ManageProcess(
        tmp_path,
        *command,
        env={"DJANGO_SETTINGS_MODULE": "misspelt_jobs", "PYTHONPATH": path},
    )
    try:
        assert process.wait() == 1, process.output
    finally:
        process.close()
    assert "(jobs.E001) unknown JOBS setting(s): LEASE_SECOND" in process.output
    assert "Traceback" not in process.output


@pytest.fixture
def workflows_unmigrated(monkeypatch) -> None:
    """The database as before ``migrate workflows``: the jobs' tables are there, the
    workflows' are not (hidden from the introspection every start-up reads)."""
    introspection = type(connection.introspection)
    real = introspection.table_names
    monkeypatch.setattr(
        introspection,
        "table_names",
        lambda self, *a, **k: [t for t in real(self, *a, **k) if not t.startswith("workflows_")],
    )


def test_a_worker_refuses_to_start_without_the_workflows_tables(workflows_unmigrated) -> None:
    """Every advance and activity job would fail there: the worker says so at once,
    as it does for the jobs' own tables, and takes nothing."""
    submit_job(SCOPE, "waiting", JobSubmission.create("demo.report", {"month": "2026-11"}))
    worker = Worker(burst=True, listen=False)
    with pytest.raises(DatabaseNotMigrated) as refused:
        worker.run()
    assert str(refused.value).splitlines() == [
        f"database 'default' lacks the tables of the 'workflows' app ({WORKFLOWS_TABLES}): "
        "its migrations have not been applied.",
        "Run 'python manage.py migrate', then start the worker again.",
    ]
    assert JobScope(SCOPE).get("waiting").status == JobStatus.QUEUED
    assert upkeep.upkeep_of(worker) is None


def test_run_jobs_ends_with_the_message_alone_and_a_failure_status(workflows_unmigrated) -> None:
    """``manage.py`` prints a CommandError's message, no traceback, and exits 1."""
    said = r"the 'workflows' app .*\nRun 'python manage.py migrate'"
    with pytest.raises(CommandError, match=said):
        call_command("run_jobs", "--burst", stdout=io.StringIO())


@pytest.mark.slow
def test_the_workflows_api_without_the_app_installed_names_the_fix(tmp_path: Path) -> None:
    """Django's own error names neither the app nor the fix."""
    (tmp_path / "without_workflows.py").write_text(
        "SECRET_KEY = 'x'\n"
        "USE_TZ = True\n"
        "INSTALLED_APPS = ['django.contrib.contenttypes', 'django.contrib.auth', 'jobs']\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}}\n"
    )
    script = (
        "import django\n"
        "django.setup()\n"
        "from workflows import workflow  # declaring needs no table\n"
        "from workflows import start_workflow\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "without_workflows",
            "PYTHONPATH": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "ledon.lazy.AppNotInstalled: workflows.start_workflow needs the 'workflows' app, "
        "which is not in INSTALLED_APPS: add 'workflows' to INSTALLED_APPS and run "
        "'python manage.py migrate'"
    )
