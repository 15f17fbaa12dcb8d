"""The ``WORKFLOWS`` setting speaks the other apps' language: the retries of a step or
an activity are the ``RETRY_*`` keys of ``JOBS`` and ``OUTBOX``, and a key of the old
names is an error of ``manage.py check`` that names the new one."""

from __future__ import annotations

import pytest
from django.core import checks
from django.test import override_settings

from ledon.backoff import RetryPace
from workflows.checks import check_workflows_settings
from workflows.conf import retry_pace

RETRY_KEYS = ("RETRY_BASE_DELAY", "RETRY_BACKOFF_FACTOR", "RETRY_MAX_DELAY", "RETRY_JITTER")


def errors() -> list[tuple[str, str]]:
    """The errors of the settings' system check (``manage.py check``)."""
    return [(m.id, m.msg) for m in check_workflows_settings() if m.level >= checks.ERROR]


def test_the_retry_keys_are_the_jobs_and_the_outboxs():
    from jobs.conf import JobsSettings
    from outbox.conf import OutboxSettings
    from workflows.conf import WorkflowsSettings

    for settings_class in (JobsSettings, OutboxSettings, WorkflowsSettings):
        assert set(RETRY_KEYS) <= set(settings_class.__dataclass_fields__)


def test_the_retries_pace_is_read_from_the_retry_keys():
    with override_settings(
        WORKFLOWS={"RETRY_BASE_DELAY": 3, "RETRY_BACKOFF_FACTOR": 3, "RETRY_MAX_DELAY": 20}
    ):
        assert retry_pace() == RetryPace(3, 3, 20, 0.0)
        assert [retry_pace().delay(n) for n in (1, 2, 3)] == [3, 9, 20]


@pytest.mark.parametrize(
    ("old", "new"),
    [("STEP_RETRY_DELAY", "RETRY_BASE_DELAY"), ("STEP_RETRY_MAX_DELAY", "RETRY_MAX_DELAY")],
)
def test_an_old_key_is_a_check_error_that_names_the_new_one(old, new):
    with override_settings(WORKFLOWS={old: 5.0}):
        assert errors() == [
            ("workflows.E001", f"unknown WORKFLOWS setting(s): {old} (renamed to {new!r})")
        ]


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("RETRY_BASE_DELAY", -1, "a number of seconds >= 0"),
        ("RETRY_BACKOFF_FACTOR", 0.5, "a number >= 1"),
        ("RETRY_JITTER", 1, "a ratio in [0, 1)"),
        ("RETRY_JITTER", True, "a ratio in [0, 1)"),
    ],
)
def test_a_bad_retry_value_is_a_check_error(key, value, expected):
    with override_settings(WORKFLOWS={key: value}):
        assert errors() == [
            ("workflows.E001", f"WORKFLOWS[{key!r}] must be {expected}, got {value!r}")
        ]
