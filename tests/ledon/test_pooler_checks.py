"""Behind a transaction pooler (docs/deployment.md): what ``JOBS`` and ``OUTBOX``
``LISTEN_DATABASE`` accept, which connection an engine LISTENs on, and the checks that
say when engines only poll or prepared statements are on. A pooled alias is one with
``DISABLE_SERVER_SIDE_CURSORS``; tests/processes/test_pgbouncer.py runs the same through a real
PgBouncer."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings

from jobs.checks import check_jobs_behind_a_pooler, check_jobs_settings
from ledon.pglisten import Listener, listen_alias
from outbox.checks import check_outbox_listen_database, check_outbox_settings


@pytest.mark.parametrize(
    ("setting", "check"), [("JOBS", check_jobs_settings), ("OUTBOX", check_outbox_settings)]
)
@pytest.mark.parametrize("value", ["nowhere", 3])
def test_a_listen_database_that_is_no_alias_is_refused(setting, check, value) -> None:
    with override_settings(**{setting: {"LISTEN_DATABASE": value}}):
        [error] = check()
    assert error.id == f"{setting.lower()}.E001"
    assert "LISTEN_DATABASE" in error.msg
    assert repr(value) in error.msg or "alias of DATABASES" in error.msg


@pytest.fixture
def pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default database as a transaction pooler's URL configures it."""
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)


def test_an_engine_never_listens_on_a_pooled_alias(pooled) -> None:
    assert listen_alias("default", None) is None
    listener = Listener("default", ["ledon_jobs"], lambda channel, payload: None)
    assert listener.alias is None
    listener.start()  # ends at once: nothing to LISTEN on, the engine polls
    listener.join(timeout=10)
    assert not listener.is_alive()


def test_an_unpooled_alias_is_listened_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", False)
    assert listen_alias("default", None) == "default"
    assert listen_alias("default", "default") == "default"


@pytest.mark.postgres_only
def test_behind_a_pooler_the_checks_say_engines_poll_and_prepared_statements_are_on(
    pooled,
) -> None:
    with override_settings(JOBS={}, OUTBOX={"ENABLED": True}):
        jobs = {message.id: message for message in check_jobs_behind_a_pooler()}
        [outbox] = check_outbox_listen_database()
    assert set(jobs) == {"jobs.W001", "jobs.W002"}
    assert "JOBS['LISTEN_DATABASE'] is 'default'" in jobs["jobs.W001"].msg
    assert "JOBS['PREPARED_STATEMENTS'] = False" in jobs["jobs.W002"].hint
    assert outbox.id == "outbox.W003"
    assert "OUTBOX['LISTEN_DATABASE']" in outbox.msg


@pytest.mark.postgres_only
def test_prepared_statements_off_silence_their_warning(pooled) -> None:
    with override_settings(JOBS={"PREPARED_STATEMENTS": False}):
        assert [message.id for message in check_jobs_behind_a_pooler()] == ["jobs.W001"]


@pytest.mark.postgres_only
def test_unpooled_nothing_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", False)
    with override_settings(JOBS={}, OUTBOX={"ENABLED": True, "LISTEN_DATABASE": "default"}):
        assert check_jobs_behind_a_pooler() == []
        assert check_outbox_listen_database() == []


def test_sqlite_polls_anyway_so_nothing_is_reported(pooled) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("about a SQLite jobs database")
    with override_settings(JOBS={}, OUTBOX={"ENABLED": True}):
        assert check_jobs_behind_a_pooler() == []
        assert check_outbox_listen_database() == []
