"""docs/schedules.md stays true: its Python examples run as they are written, in order,
and do what the page says."""

from __future__ import annotations

import json

import pytest

from jobs import JobStatus, execution
from jobs.conf import jobs_settings
from jobs.schedules import declarations
from jobs.schedules.types import ScheduleOutcome
from tests.support.schedules import period_jobs, row, schedules  # noqa: F401  (fixture)
from tests.test_docs_examples import python_blocks, run_page

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("schedules")]

PAGE = "docs/schedules.md"


def test_the_schedules_page_examples_declare_enqueue_run_and_steer():
    assert len(python_blocks(PAGE)) == 5
    namespace = run_page(PAGE)

    names = [spec.name for spec in declarations.declared()]
    assert names == ["crm-sync", "daily-report", "ledger-close", "weekly-digest"]
    digest = declarations.get("weekly-digest")
    assert digest is not None
    assert json.loads(digest.submission.payload_json)["args"] == ["monday"]

    assert namespace["first"] == []
    assert [job.job_id for job in namespace["due"]] == [
        "crm-sync@2026-12-01T05:00:00Z",
        "daily-report@2026-12-01T05:00:00Z",
        "ledger-close@2026-12-01T05:00:00Z",
    ]
    assert {run.job_id for run in namespace["runs"]} >= {
        "crm-sync@2026-12-01T05:00:00Z",
        "daily-report@2026-12-01T05:00:00Z",
    }
    report = execution.reserved_scope("periodic").get("daily-report@2026-12-01T05:00:00Z")
    assert report is not None
    assert report.status == JobStatus.SUCCEEDED
    assert report.result_ref == "reports/2026-12-01T05:00:00Z.pdf"
    assert (report.queue, report.max_attempts) == ("reports", 3)

    # pause, then resume: the schedule is active again; run now made a manual job.
    assert not row("crm-sync").paused
    assert namespace["job"].job_id.startswith("daily-report@manual-")
    assert namespace["job"].job_id in period_jobs("daily-report")
    assert row("daily-report").last_job_id == namespace["job"].job_id

    # The settings block is a valid JOBS setting.
    jobs_settings.read(namespace["JOBS"])


def test_the_pause_example_reports_its_outcomes():
    run_page(PAGE, skip_last=True)
    from jobs.schedules import pause

    assert pause("daily-report") is ScheduleOutcome.PAUSED
    assert pause("daily-report") is ScheduleOutcome.ALREADY_PAUSED
