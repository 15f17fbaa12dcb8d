"""``manage.py run_jobs`` as a new user meets it: its --help and its hints."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from django.core.management import call_command

from jobs import JobSubmission, submit_job
from jobs.management.commands.run_jobs import Command

ROOT = Path(__file__).resolve().parents[2]


def test_help_and_workers_page_state_the_default_concurrency() -> None:
    text = Command().create_parser("manage.py", "run_jobs").format_help()
    assert re.search(r"--concurrency N\s+.*default: 1\)", " ".join(text.split()))
    row = next(
        line
        for line in (ROOT / "docs" / "workers.md").read_text().splitlines()
        if line.startswith("| `--concurrency N`")
    )
    assert "default 1" in row


def run_burst(*args: str) -> str:
    out = io.StringIO()
    call_command("run_jobs", "--burst", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_a_queue_nothing_uses_gets_a_hint_naming_where_jobs_wait() -> None:
    for n in range(3):
        submit_job("s", f"d-{n}", JobSubmission.create("x.y", queue="default"))
    submit_job("s", "e", JobSubmission.create("x.y", queue="emails"))
    output = run_burst("--queue", "nothing-uses-this")
    assert (
        "no job is due in queue nothing-uses-this, but 4 wait in other queues "
        "(default: 3, emails: 1)" in output
    )
    assert "--queue" in output.split("hint:", 1)[1]


@pytest.mark.django_db(transaction=True)
def test_no_hint_when_the_queue_has_work_or_every_queue_is_taken() -> None:
    submit_job("s", "e", JobSubmission.create("x.y", queue="emails"))
    submit_job("s", "d", JobSubmission.create("x.y", queue="default"))
    assert "hint:" not in run_burst("--queue", "emails")
    assert "hint:" not in run_burst()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--concurrency", "100000"),
            "--concurrency must be between 1 and 1000 (handler threads of one process; "
            "run more worker processes for more), got 100000",
        ),
        (("--concurrency", "0"), "--concurrency must be between 1 and 1000"),
        (
            ("--worker-id", ""),
            "--worker-id must not be empty (leave it out for the default, host:pid)",
        ),
        (("--worker-id", " w-1"), "--worker-id must not start or end with spaces"),
        (("--shutdown-timeout", "nan"), "--shutdown-timeout must be seconds"),
        (("--shutdown-timeout", "-1"), "--shutdown-timeout must be seconds"),
        (("--metrics-port", "70000"), "--metrics-port must be between 0 and 65535"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(args, message) -> None:
    """No banner, no thread, no database: the command stops at its options."""
    from django.core.management import CommandError

    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("run_jobs", "--burst", *args, stdout=out, stderr=err)
    assert out.getvalue() == err.getvalue() == ""


def test_the_workers_page_states_the_concurrency_limit() -> None:
    from jobs.management.commands.run_jobs import MAX_CONCURRENCY

    row = next(
        line
        for line in (ROOT / "docs" / "workers.md").read_text().splitlines()
        if line.startswith("| `--concurrency N`")
    )
    assert f"at most {MAX_CONCURRENCY:,}" in row
