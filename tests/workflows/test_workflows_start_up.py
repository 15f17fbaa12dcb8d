"""Mistakes at start-up with ``workflows`` installed: each is said in a line or two
that names the fix, never a traceback — a misspelt ``JOBS`` key is ``jobs.E001`` in
``check``, ``migrate`` and ``run_jobs``; a worker whose database lacks the workflows'
tables refuses to start, naming ``migrate``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.core import checks
from django.test import override_settings

from tests.support.procs import ManageProcess, settings_module
from workflows import registry, start_workflow

pytestmark = pytest.mark.django_db(transaction=True)

SCOPE = "tenant-start-up"


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
