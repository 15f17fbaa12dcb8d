"""Compensate and resume every saga instance the admin's filters match ("Select all
N"): a confirmation page with the dry run first, nothing changed until "Yes"; then each
instance changes as the rules allow and is handed to the runners, which drive it; the
instances a runner holds, and finished ones, are left."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from sagas import SagaExecutionError, SagaStatus, resume_saga, run_saga, start_saga, store
from sagas.models import SagaInstance
from tests.support.bulk import across as support_across
from tests.support.sagas import ORDER, instance, order, runs, stopped_after_reserve

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = reverse("admin:sagas_sagainstance_changelist")


def runner_died(instance_id: uuid.UUID) -> uuid.UUID:
    """The instance, taken by a runner that then died: its lease expired."""
    assert store.claim(store.require(instance_id), "dead", lease_seconds=60) is not None
    expire(instance_id)
    return instance_id


def expire(instance_id: uuid.UUID) -> None:
    # The lease's end is the only thing a test may move by hand: time passing.
    SagaInstance.objects.filter(instance_id=instance_id).update(
        leased_until=timezone.now() - timedelta(seconds=5)
    )


@pytest.fixture
def sagas(settings: Any) -> dict[str, uuid.UUID]:
    """One instance in each situation the two operations tell apart."""
    live = store.claim(start_saga("fulfilment.order", data=ORDER), "node-1", lease_seconds=300)
    assert live is not None
    compensating = store.claim(start_saga("fulfilment.order", data=ORDER), "gone", lease_seconds=60)
    assert compensating is not None
    store.begin_compensation(compensating, "gone", "", "stopped")
    store.release(store.require(compensating.instance_id), "gone")
    settings.SAGAS = {**settings.SAGAS, "COMPENSATION_ATTEMPTS": 1, "COMPENSATION_RETRY_DELAY": 0}
    with pytest.raises(SagaExecutionError) as caught:
        run_saga("fulfilment.order", data=order(fail_at="ship", fail_compensation={"reserve": 1}))
    settings.SAGAS = {**settings.SAGAS, "COMPENSATION_ATTEMPTS": 2}
    return {
        "waiting": start_saga("fulfilment.order", data=ORDER).instance_id,
        "stopped": runner_died(stopped_after_reserve()),
        "live": live.instance_id,
        "compensating": compensating.instance_id,
        "failed": caught.value.instance_id,
        "succeeded": run_saga("fulfilment.order", data=ORDER).instance_id,
    }


def rows() -> dict[uuid.UUID, dict[str, Any]]:
    return {row["instance_id"]: row for row in SagaInstance.objects.values()}


def across(client: Client, action: str, query: str = "", **extra: Any) -> Any:
    return support_across(client, CHANGELIST, SagaInstance, action, query, **extra)


def test_compensate_all_matching_shows_the_dry_run_then_hands_them_to_the_runners(
    admin_client, sagas
):
    before = rows()
    page = across(admin_client, "compensate_instances")

    assert rows() == before
    assert "Compensate all 6 matching saga instances?" in page.content.decode()
    preview = page.context["preview"]
    assert dict(preview.changed) == {"compensation started": 2, "compensation tried again": 1}
    assert {why: n for why, n in preview.reasons.items() if n} == {
        "leased to a runner now": 1,
        "compensating already (a runner goes on with them)": 1,
        "finished": 1,
    }

    done = across(
        admin_client,
        "compensate_instances",
        bulk_confirm="1",
        bulk_up_to=str(page.context["up_to"]),
    )

    assert done.status_code == 302
    [message] = [str(m) for m in get_messages(done.wsgi_request)]
    assert message.startswith(
        "6 saga instances matched: changed 3 (2 compensation started, 1 compensation tried "
        "again), skipped 3"
    )
    after = rows()
    for name in ("waiting", "stopped", "failed"):
        row = after[sagas[name]]
        assert (row["status"], row["leased_by"], row["leased_until"], row["takeovers"]) == (
            SagaStatus.COMPENSATING,
            "",
            None,
            0,
        ), name
        assert row["version"] == before[sagas[name]]["version"] + 1
    assert after[sagas["stopped"]]["error"] == "compensation requested in the admin by admin"
    for name in ("live", "compensating", "succeeded"):
        assert after[sagas[name]] == before[sagas[name]], name
    # A runner takes it from there: the completed step is undone.
    final = resume_saga(sagas["stopped"])
    assert (final.status, final.compensated_steps) == (SagaStatus.COMPENSATED, ("reserve",))
    assert runs(sagas["stopped"], "compensation") == ["reserve"]


def test_resume_all_matching_releases_the_instances_whose_runner_is_gone(admin_client, sagas):
    before = rows()
    page = across(admin_client, "resume_instances", "status__exact=running")
    preview = page.context["preview"]
    assert (preview.matched, dict(preview.changed)) == (3, {"handed to the runners": 1})
    assert preview.reasons["waiting for a runner already"] == 1
    assert preview.reasons["leased to a runner now"] == 1
    assert rows() == before

    across(
        admin_client,
        "resume_instances",
        "status__exact=running",
        bulk_confirm="1",
        bulk_up_to=str(page.context["up_to"]),
    )

    after = rows()
    stopped = after[sagas["stopped"]]
    assert (stopped["status"], stopped["leased_by"], stopped["leased_until"]) == (
        SagaStatus.RUNNING,
        "",
        None,
    )
    assert stopped["version"] == before[sagas["stopped"]]["version"] + 1
    for name in ("waiting", "live", "compensating", "failed", "succeeded"):
        assert after[sagas[name]] == before[sagas[name]], name
    # The next runner's claim is not counted as a takeover: the lease was released.
    claimed = store.claim(store.require(sagas["stopped"]), "runner-2", lease_seconds=30)
    assert claimed is not None
    assert claimed.takeovers == 0


def test_takeovers_count_from_zero_again_after_a_bulk_resume(sagas):
    stopped = store.require(sagas["stopped"])
    claimed = store.claim(stopped, "runner-2", lease_seconds=30)
    assert claimed is not None
    assert claimed.takeovers == 1
    expire(stopped.instance_id)

    outcome = store.resume_many([instance(stopped.instance_id).pk])

    assert dict(outcome.changed) == {"handed to the runners": 1}
    assert instance(stopped.instance_id).takeovers == 0


def test_a_lease_taken_between_the_count_and_the_batch_is_left_alone(sagas):
    """The guard is read when the batch runs: a runner that claimed the instance since
    its page was read keeps it."""
    stopped = store.require(sagas["stopped"])
    assert store.claim(stopped, "runner-3", lease_seconds=300) is not None
    version = instance(stopped.instance_id).version

    outcome = store.compensate_many([instance(stopped.instance_id).pk], reason="x")

    assert outcome.total == 0
    row = instance(stopped.instance_id)
    assert (row.status, row.leased_by, row.version) == (SagaStatus.RUNNING, "runner-3", version)
