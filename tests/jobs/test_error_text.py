"""One rule for every stored error text: bounded, valid, and a long one keeps its
start and its end — for an exception, its traceback's first frames and its own
``Type: message`` line, however long the message. A job's attempts share a bounded
total, so a job failing a thousand times cannot store a thousand full tracebacks."""

from __future__ import annotations

import pytest

from jobs import JobScope, JobSubmission, submit_job
from jobs.backends.results import format_task_error, parse_task_error
from jobs.testing import run_jobs_inline
from jobs.validation import MAX_JOB_ERROR_TOTAL, MAX_TEXT_LENGTH, attempt_error_limit
from ledon.errors import CUT_MARK, format_error, storable_text


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def chained(n: int) -> KeyError:
    """A KeyError raised from a chain of ``n`` causes: a long, varied traceback."""
    cause: BaseException | None = None
    for i in range(n):
        try:
            raise ValueError(f"cause {i}") from cause
        except ValueError as exc:
            cause = exc
    try:
        raise KeyError("deep in the stack") from cause
    except KeyError as exc:
        return exc


def test_a_short_error_is_stored_whole() -> None:
    exc = raised(ValueError("bad input"))
    text = format_error(exc)
    assert text.startswith("Traceback (most recent call last):")
    assert text.endswith("ValueError: bad input\n")
    assert "characters cut" not in text


def test_a_huge_message_keeps_the_type_and_both_ends_of_the_message() -> None:
    exc = raised(ValueError("START " + "x" * 300_000 + " END"))
    text = format_error(exc, 5_000)
    assert len(text) <= 5_000
    assert text.startswith("Traceback (most recent call last):")
    assert "\nValueError: START xxx" in text
    assert text.endswith(" END\n")
    assert "characters cut" in text


def test_a_deep_traceback_is_cut_in_its_frames_never_in_the_last_line() -> None:
    text = format_error(chained(300), 2_000)
    assert len(text) <= 2_000
    assert text.startswith("Traceback (most recent call last):")
    assert text.endswith("KeyError: 'deep in the stack'\n")
    assert "characters cut" in text


def test_plain_text_keeps_its_start_and_end_and_becomes_valid() -> None:
    text = storable_text("head \x00 \ud800 " + "m" * 10_000 + " tail", 1_000)
    assert len(text) <= 1_000
    assert text.startswith("head \\x00 \\ud800 ")
    assert text.endswith(" tail")
    text.encode("utf-8")


def test_the_tasks_backend_follows_the_same_rule() -> None:
    exc = raised(ValueError("\ud800 lone surrogate, NUL \x00, " + "x" * 300_000 + " END"))
    text = format_task_error(exc)
    assert len(text) <= MAX_TEXT_LENGTH
    assert "\x00" not in text
    text.encode("utf-8")
    error = parse_task_error(text)
    assert error is not None
    assert error.exception_class_path == "builtins.ValueError"
    assert "\nValueError: \\ud800 lone surrogate, NUL \\x00, xxx" in error.traceback
    assert error.traceback.endswith(" END\n")
    assert CUT_MARK.split("{")[0] in error.traceback


@pytest.mark.parametrize(
    ("max_attempts", "limit"), [(1, 100_000), (10, 100_000), (100, 10_000), (1000, 1_000)]
)
def test_each_attempt_gets_its_share_of_the_jobs_total(max_attempts, limit) -> None:
    assert attempt_error_limit(max_attempts) == limit
    assert max_attempts * attempt_error_limit(max_attempts) <= MAX_JOB_ERROR_TOTAL


@pytest.mark.django_db(transaction=True)
def test_a_job_with_many_attempts_stores_a_bounded_error_per_attempt(handler) -> None:
    @handler("errors.huge")
    def fail(ctx):
        raise RuntimeError("BEGIN " + "y" * 200_000 + " FINISH")

    submit_job("tenant-errors", "e", JobSubmission.create("errors.huge", max_attempts=500))
    [ended] = run_jobs_inline(max_attempts_run=1)
    assert ended.outcome.value == "requeued"
    snap = JobScope("tenant-errors").get("e")
    [attempt] = snap.attempts
    assert len(attempt.error) <= 2_000
    assert "RuntimeError: BEGIN yyy" in attempt.error
    assert attempt.error.endswith(" FINISH\n")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("retried", [False, True])
def test_the_job_row_keeps_a_summary_and_the_attempt_the_whole_text(make_job, retried) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from jobs import execution

    claim = make_job.running("j", max_attempts=2)
    error = format_error(raised(ValueError("START " + "z" * 50_000 + " END")))
    retry_at = timezone.now() + timedelta(hours=1) if retried else None
    execution.fail(claim.token, error, retry_at=retry_at)
    snap = make_job.get("j")
    [attempt] = snap.attempts
    assert attempt.error == error  # stored once, whole, on the attempt
    assert len(snap.error) <= 2_000
    assert snap.error.startswith("Traceback (most recent call last):")
    assert snap.error.endswith(" END\n")
    assert "characters cut" in snap.error
    # A short error is the same on both rows.
    if not retried:
        return
    again = execution.try_start(make_job.scope_hash, "j", now=retry_at)
    assert again is not None
    execution.fail(again.token, "boom")
    assert make_job.get("j").error == "boom"
