"""Settings mistakes a new user makes: the system check says what is wrong, suggests
the key that was meant, and names a settings reference page that exists."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
from django.test import override_settings

from jobs.checks import check_jobs_settings
from jobs.conf import JobsSettings
from outbox.checks import check_outbox_settings
from outbox.conf import OutboxSettings
from sagas.checks import check_sagas_settings
from sagas.conf import SagasSettings

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "settings.md"


def _anchors(page: Path) -> set[str]:
    """The heading anchors Sphinx (MyST) makes for a page's headings."""
    return {
        re.sub(r"[^\w\- ]", "", title).strip().lower().replace(" ", "-")
        for title in re.findall(r"^#{1,3} (.+)$", page.read_text(), re.M)
    }


@pytest.mark.parametrize(
    ("setting", "check", "typo", "meant"),
    [
        ("JOBS", check_jobs_settings, "LEASE_SECOND", "LEASE_SECONDS"),
        ("OUTBOX", check_outbox_settings, "ENABLE", "ENABLED"),
        ("SAGAS", check_sagas_settings, "STEP_TIMEOUTS", "STEP_TIMEOUT"),
    ],
)
def test_a_misspelt_key_gets_a_suggestion_and_a_hint_naming_the_reference(
    setting, check, typo, meant
) -> None:
    with override_settings(**{setting: {typo: 1}}):
        [error] = check()
    assert error.id == f"{setting.lower()}.E001"
    assert f"unknown {setting} setting(s): {typo} (did you mean {meant!r}?)" in error.msg
    url = re.search(r"https://\S+/settings\.html#([\w-]+)", error.hint)
    assert url, error.hint
    assert url.group(1) == setting.lower()
    assert url.group(1) in _anchors(REFERENCE)


@pytest.mark.parametrize(
    ("setting", "check", "bad", "named"),
    [
        (
            "JOBS",
            check_jobs_settings,
            {"LEASE_SECOND": 1, "POLL_INTERVAL": 0, "RETENTION_SECONDS": "7d", "MAX_SNOOZES": -1},
            ["LEASE_SECOND", "POLL_INTERVAL", "RETENTION_SECONDS", "MAX_SNOOZES"],
        ),
        (
            "OUTBOX",
            check_outbox_settings,
            {"ENABLE": 1, "BATCH_SIZE": 0, "PARKED_RETENTION_SECONDS": -1},
            ["ENABLE", "BATCH_SIZE", "PARKED_RETENTION_SECONDS"],
        ),
        (
            "SAGAS",
            check_sagas_settings,
            {"LEASE_SECONDS": -1, "RETENTION_SECONDS": 0, "MAX_TAKEOVERS": "3"},
            ["LEASE_SECONDS", "RETENTION_SECONDS", "MAX_TAKEOVERS"],
        ),
    ],
)
def test_every_bad_key_is_reported_at_once(setting, check, bad, named) -> None:
    with override_settings(**{setting: bad}):
        errors = check()
    assert {error.id for error in errors} == {f"{setting.lower()}.E001"}
    assert len(errors) == len(named)
    for key in named:
        assert any(key in error.msg for error in errors), (key, [e.msg for e in errors])


def test_values_good_together_are_not_reported_for_the_defaults_beside_them() -> None:
    # A lease shorter than the default heartbeat, with a heartbeat that fits it.
    with override_settings(JOBS={"LEASE_SECONDS": 3, "HEARTBEAT_SECONDS": 1}):
        assert check_jobs_settings() == []
    with override_settings(JOBS={"LEASE_SECONDS": 3, "HEARTBEAT_SECONDS": 1, "POLL_INTERVAL": 0}):
        messages = [error.msg for error in check_jobs_settings()]
    assert len(messages) == 1
    assert "POLL_INTERVAL" in messages[0]
    with override_settings(JOBS={"LEASE_SECONDS": 3, "HEARTBEAT_SECONDS": 5}):
        [error] = check_jobs_settings()
    assert "HEARTBEAT_SECONDS" in error.msg


def test_no_suggestion_for_a_key_like_none_of_them() -> None:
    with override_settings(JOBS={"COMPLETELY_DIFFERENT": 1}):
        [error] = check_jobs_settings()
    assert error.msg == "unknown JOBS setting(s): COMPLETELY_DIFFERENT"


@pytest.mark.parametrize("setting", ["JOBS", "OUTBOX", "SAGAS", "TASKS"])
def test_the_reference_lists_every_key_with_its_default(setting) -> None:
    from dataclasses import fields

    from jobs.backends.options import KNOWN_OPTIONS
    from jobs.conf import JobsSettings
    from outbox.conf import OutboxSettings
    from sagas.conf import SagasSettings

    keys = {
        "JOBS": [f.name for f in fields(JobsSettings)],
        "OUTBOX": [f.name for f in fields(OutboxSettings)],
        "SAGAS": [f.name for f in fields(SagasSettings)],
        "TASKS": list(KNOWN_OPTIONS),
    }[setting]
    text = REFERENCE.read_text()
    section = text.split(f"\n## {setting}\n", 1)[1].split("\n## ", 1)[0]
    missing = [key for key in keys if f"`{key}`" not in section]
    assert missing == []


@pytest.mark.parametrize("setting", ["JOBS", "OUTBOX", "SAGAS"])
def test_the_reference_defaults_are_the_codes(setting) -> None:
    import ast
    from dataclasses import MISSING, fields

    from jobs.conf import JobsSettings
    from outbox.conf import OutboxSettings
    from sagas.conf import SagasSettings

    cls = {"JOBS": JobsSettings, "OUTBOX": OutboxSettings, "SAGAS": SagasSettings}[setting]
    section = REFERENCE.read_text().split(f"\n## {setting}\n", 1)[1].split("\n## ", 1)[0]
    documented = dict(re.findall(r"^\| `(\w+)` \| `([^`]+)`", section, re.M))
    for f in fields(cls):
        default = f.default_factory() if f.default is MISSING else f.default
        assert ast.literal_eval(documented[f.name]) == default, f.name


# --------------------------------------------------------------------------- SQLite


def _sqlite(name: str = "/tmp/x/db.sqlite3", **options) -> dict:
    config = {"ENGINE": "django.db.backends.sqlite3", "NAME": name}
    if options:
        config["OPTIONS"] = options
    return config


GOOD = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL;",
}


def sqlite_warnings(**databases) -> list:
    from ledon.checks import sqlite_warnings

    return sqlite_warnings(databases)


def test_startprojects_default_sqlite_gets_a_warning_with_the_options_to_paste() -> None:
    [warning] = sqlite_warnings(default=_sqlite())
    assert warning.id == "ledon.W001"
    assert "'default'" in warning.msg
    for lacking in ("transaction_mode IMMEDIATE", "WAL", "busy timeout"):
        assert lacking in warning.msg
    assert "database is locked" in warning.msg
    pasted = warning.hint.split("['OPTIONS'] = ", 1)[1]
    import ast

    assert ast.literal_eval(pasted) == GOOD


def test_each_missing_piece_is_named_and_other_options_are_kept() -> None:
    [warning] = sqlite_warnings(
        default=_sqlite(transaction_mode="IMMEDIATE", timeout=20, check_same_thread=False)
    )
    assert "WAL" in warning.msg
    assert "IMMEDIATE" not in warning.msg.split("without", 1)[1]
    import ast

    pasted = ast.literal_eval(warning.hint.split("['OPTIONS'] = ", 1)[1])
    assert pasted == {**GOOD, "check_same_thread": False}


def test_well_configured_in_memory_and_postgres_databases_are_not_warned() -> None:
    assert (
        sqlite_warnings(
            default=_sqlite(**GOOD),
            lower=_sqlite(
                transaction_mode="immediate",
                timeout=5,
                init_command="PRAGMA synchronous=NORMAL; pragma journal_mode = wal",
            ),
            memory=_sqlite(":memory:"),
            pg={"ENGINE": "django.db.backends.postgresql", "NAME": "x"},
        )
        == []
    )


def test_the_test_project_is_configured_as_the_check_asks() -> None:
    from ledon.checks import check_sqlite_options

    assert check_sqlite_options() == []


def _documented_defaults(section: str) -> dict[str, object]:
    """The reference's table under ``## section``: each key and its default, read as
    the Python literal its second column shows."""
    text = REFERENCE.read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Z_]+)` \| `([^`]+)`", body, re.M)
    return {key: ast.literal_eval(default) for key, default in rows}


@pytest.mark.parametrize(
    ("section", "settings_class"),
    [("JOBS", JobsSettings), ("OUTBOX", OutboxSettings), ("SAGAS", SagasSettings)],
)
def test_the_reference_lists_every_setting_with_the_codes_default(section, settings_class):
    documented = _documented_defaults(section)
    defaults = {
        f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(settings_class)
    }
    assert sorted(documented) == sorted(defaults)
    wrong = {
        key: (documented[key], default)
        for key, default in defaults.items()
        if documented[key] != default or type(documented[key]) is not type(default)
    }
    assert wrong == {}


@pytest.mark.parametrize(("value", "errors"), [(None, 0), ("", 0), ("t0ken", 0), (123, 1)])
def test_the_metrics_token_is_a_string_or_none(settings, value, errors) -> None:
    from ledon.checks import check_metrics_token

    settings.LEDON_METRICS_TOKEN = value
    found = check_metrics_token()
    assert len(found) == errors
    if errors:
        [error] = found
        assert error.id == "ledon.E001"
        assert error.msg == "LEDON_METRICS_TOKEN must be a string or None, got int"
        url = re.search(r"https://\S+/settings\.html#([\w-]+)", error.hint)
        assert url.group(1) in _anchors(REFERENCE)
