"""Retention of finished saga instances, on by default (``SAGAS["RETENTION_SECONDS"]``,
14 days; None keeps for ever): succeeded and compensated instances are deleted by
every saga runner in bounded batches and by ``manage.py purge_sagas``; running,
compensating and failed (needs attention) ones never are."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from sagas import SagaExecutionError, SagaStatus, run_saga, start_saga, store
from sagas.conf import sagas_settings
from sagas.exceptions import InvalidInput, SagasConfigurationError
from sagas.models import SagaInstance
from sagas.testing import drive_pending_sagas, temporary_saga

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)
NAME = "retention.saga"


def noop(ctx: Any) -> None:
    pass


def boom(ctx: Any) -> None:
    raise RuntimeError("boom")


@pytest.fixture
def saga(settings) -> Any:
    settings.SAGAS = {
        **getattr(settings, "SAGAS", {}),
        "COMPENSATION_ATTEMPTS": 1,
        "COMPENSATION_RETRY_DELAY": 0,
    }
    with temporary_saga(NAME) as definition:
        definition.step("one", noop, compensate=noop)
        yield definition


def finished(key: str, status: SagaStatus, days: float) -> None:
    """An instance that ended in ``status`` ``days`` ago."""
    if status is SagaStatus.SUCCEEDED:
        run_saga(NAME, {"k": key}, idempotency_key=key)
    else:
        with temporary_saga(NAME) as failing:
            if status is SagaStatus.COMPENSATED:
                failing.step("one", noop, compensate=noop).step("two", boom)
            else:
                failing.step("one", noop, compensate=boom).step("two", boom)
            with pytest.raises(SagaExecutionError):
                run_saga(NAME, {"k": key}, idempotency_key=key)
    row = SagaInstance.objects.get(idempotency_key=key)
    assert row.status == status
    SagaInstance.objects.filter(pk=row.pk).update(finished_at=timezone.now() - days * DAY)


def history() -> None:
    finished("ok-old", SagaStatus.SUCCEEDED, 15)
    finished("ok-new", SagaStatus.SUCCEEDED, 13)
    finished("undone-old", SagaStatus.COMPENSATED, 20)
    finished("failed-old", SagaStatus.FAILED, 100)


def keys() -> set[str]:
    return set(SagaInstance.objects.values_list("idempotency_key", flat=True))


def test_retention_is_on_by_default_for_fourteen_days() -> None:
    assert sagas_settings().RETENTION_SECONDS == 14 * 86_400


def test_a_runner_deletes_finished_instances_past_the_retention(saga) -> None:
    history()
    start_saga(NAME, {"k": "live"}, idempotency_key="live")
    stats = drive_pending_sagas()
    assert stats.purged == 2
    assert "purged 2" in stats.summary()
    assert keys() == {"ok-new", "failed-old", "live"}


def test_none_keeps_finished_instances_for_ever(saga, settings) -> None:
    settings.SAGAS = {**settings.SAGAS, "RETENTION_SECONDS": None}
    history()
    assert drive_pending_sagas().purged == 0
    assert len(keys()) == 4


def test_purge_finished_in_batches_oldest_first(saga) -> None:
    history()
    cutoff = timezone.now() - 14 * DAY
    assert store.purge_finished(older_than=cutoff, limit=1) == 1
    assert "undone-old" not in keys()
    assert store.purge_finished(older_than=cutoff, limit=1) == 1
    assert store.purge_finished(older_than=cutoff) == 0
    assert keys() == {"ok-new", "failed-old"}


@pytest.mark.parametrize("limit", [0, -1, True, 10**9, "5"])
def test_a_bad_limit_is_typed_and_deletes_nothing(saga, limit) -> None:
    history()
    with pytest.raises(InvalidInput, match="limit"):
        store.purge_finished(older_than=timezone.now(), limit=limit)
    assert len(keys()) == 4


@pytest.mark.parametrize("value", [0, -1, "14d", True])
def test_the_setting_is_none_or_positive(settings, value) -> None:
    settings.SAGAS = {"RETENTION_SECONDS": value}
    with pytest.raises(SagasConfigurationError, match="RETENTION_SECONDS"):
        sagas_settings()


class TestPurgeSagasCommand:
    def test_without_an_argument_uses_the_default_retention(self, saga, capsys) -> None:
        history()
        call_command("purge_sagas")
        assert "deleted 2 finished saga instance(s)" in capsys.readouterr().out
        assert keys() == {"ok-new", "failed-old"}

    def test_older_than_days_and_dry_run(self, saga, capsys) -> None:
        history()
        call_command("purge_sagas", "--older-than-days", "1", "--dry-run")
        assert "3 finished saga instance(s)" in capsys.readouterr().out
        assert len(keys()) == 4
        call_command("purge_sagas", "--older-than-days", "1")
        assert keys() == {"failed-old"}

    def test_none_and_no_argument_is_an_error(self, saga, settings) -> None:
        settings.SAGAS = {**settings.SAGAS, "RETENTION_SECONDS": None}
        with pytest.raises(CommandError, match="RETENTION_SECONDS"):
            call_command("purge_sagas")
