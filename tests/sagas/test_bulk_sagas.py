"""``manage.py bulk_sagas compensate|resume`` and what it stands on (:mod:`sagas.bulk`,
the store's ``compensate_many``/``resume_many``, :mod:`ledon.bulk`): every saga
instance a filter matches and only those change, by the rules of the bulk
transitions; a dry run changes nothing; bad input is refused before anything is
written and the command exits 1; the runners then drive what it handed them."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError
from django.db import transaction
from django.utils import timezone

from ledon.bulk import BulkFilter, run_bulk
from sagas import SagaStatus, store
from sagas import bulk as sagas_bulk
from sagas.exceptions import InvalidInput
from sagas.models import SagaInstance
from sagas.testing import drive_pending_sagas
from tests.support.bulk import (
    Row,
    argv,
    assert_changed_exactly,
    held,
    run_command,
    table,
    written_out,
)
from tests.support.procs import ManageProcess
from tests.support.sagas import runs, stopped_after_reserve

pytestmark = pytest.mark.django_db(transaction=True)

NAMES = ("fulfilment.order", "billing.charge")
SITUATIONS = (
    "waiting",
    "stopped",
    "live",
    "compensating",
    "failed",
    "succeeded",
    "compensated",
)
#: Days before now each instance of the world was created.
AGES = (0, 1, 2)
NOW = timezone.now()


def created(age: int) -> datetime:
    return NOW - timedelta(days=age, hours=1)


def make(name: str, situation: str, age: int, error: str) -> uuid.UUID:
    """One instance brought into ``situation`` through the store, created ``age`` days
    ago; a runner that took it then is long gone (its 60 s lease expired)."""
    at = created(age)
    owner = "" if situation == "waiting" else "gone"
    state = store.create(
        name, ["reserve", "ship"], {"n": age}, idempotency_key=None, owner=owner,
        lease_seconds=60, now=at,
    )  # fmt: skip
    if situation == "live":
        assert store.renew(state.instance_id, "gone", lease_seconds=3600)
    elif situation == "succeeded":
        version = store.complete_step(state, "gone", "reserve", {}, now=at)
        state = store.require(state.instance_id)
        assert state.version == version
        store.complete_step(state, "gone", "ship", {}, now=at)
    elif situation in ("compensating", "failed", "compensated"):
        store.begin_compensation(state, "gone", "ship", error, now=at)
        state = store.require(state.instance_id)
        if situation == "failed":
            store.give_up(state, "gone", "refund service DOWN", now=at)
        elif situation == "compensated":
            store.finish_compensation(state, "gone", now=at)
    return state.instance_id


@pytest.fixture
def world() -> None:
    """Instances of two sagas in every situation the operations tell apart, of three
    ages; a compensating, failed or compensated one's error says "Card DECLINED" or
    "timeout"; a failed one's compensation error says "refund service DOWN"."""
    for name in NAMES:
        for situation in SITUATIONS:
            for age in AGES:
                make(name, situation, age, "Card DECLINED" if age % 2 == 0 else "timeout")


def rows() -> dict[int, Row]:
    return table(SagaInstance)


def bulk_sagas(*args: str) -> str:
    return run_command("bulk_sagas", *args)


def lease_free(row: Row) -> bool:
    return row["leased_until"] is None or row["leased_until"] < timezone.now()


def handed_over(row: Row, **values: Any) -> Row:
    """For the next runner: unleased, takeovers from zero, version moved on."""
    return {
        **row,
        "leased_by": "",
        "leased_until": None,
        "takeovers": 0,
        "version": row["version"] + 1,
        **values,
    }


def compensated_by_rules(row: Row, reason: str) -> Row:
    if row["status"] == SagaStatus.RUNNING and lease_free(row):
        return handed_over(row, status=SagaStatus.COMPENSATING, failed_step="", error=reason)
    if row["status"] == SagaStatus.FAILED:
        return handed_over(row, status=SagaStatus.COMPENSATING, finished_at=None)
    return row


def resumed_by_rules(row: Row) -> Row:
    active = row["status"] in (SagaStatus.RUNNING, SagaStatus.COMPENSATING)
    waiting = row["leased_until"] is None and row["takeovers"] == 0
    if active and lease_free(row) and not waiting:
        return handed_over(row)
    return row


#: The columns the rules speak of; ``updated_at`` moves with every change.
RULED = (
    "status",
    "failed_step",
    "error",
    "compensation_error",
    "leased_by",
    "leased_until",
    "takeovers",
    "version",
    "finished_at",
    "completed_steps",
    "compensated_steps",
    "data",
)


def changed_exactly(
    before: dict[int, Row], options: dict[str, str], rule: Callable[[Row], Row]
) -> int:
    """The instances the filter ``options`` selected are as ``rule`` makes them, the
    others as they were (:func:`~tests.support.bulk.assert_changed_exactly`); how many
    changed. ``--error-contains`` searches both errors."""
    selects = written_out(options, error_fields=("error", "compensation_error"))
    return assert_changed_exactly(before, rows(), selects=selects, rule=rule, ruled=RULED)


FILTERS = [
    {"status": "running"},
    {"name": "billing.charge"},
    {"status": "failed", "name": "fulfilment.order"},
    {"since": created(1).isoformat(), "until": created(0).isoformat()},
    {"error_contains": "card declined"},
    {"error_contains": "DOWN"},  # a compensation's error
    {"status": "compensating", "since": created(1).isoformat()},
]


@pytest.mark.parametrize("options", FILTERS)
def test_compensate_changes_exactly_the_matching_instances_by_the_rules(world, options):
    before = rows()

    output = bulk_sagas("compensate", *argv(options), "--reason", "bad batch", "--batch-size", "5")

    changed = changed_exactly(before, options, lambda row: compensated_by_rules(row, "bad batch"))
    assert f"changed {changed} (" in output


@pytest.mark.parametrize("options", FILTERS)
def test_resume_changes_exactly_the_matching_instances_by_the_rules(world, options):
    before = rows()

    output = bulk_sagas("resume", *argv(options), "--batch-size", "5")

    changed = changed_exactly(before, options, resumed_by_rules)
    assert f"changed {changed} ({changed} handed to the runners)" in output


def test_without_a_reason_the_operator_is_the_reason(world):
    bulk_sagas("compensate", "--status", "running", "--name", "billing.charge")

    started = SagaInstance.objects.filter(name="billing.charge", status=SagaStatus.COMPENSATING)
    reasons = set(started.exclude(failed_step="ship").values_list("error", flat=True))
    assert reasons == {"compensation requested by an operator"}


@pytest.mark.parametrize(
    ("operation", "would", "skipped"),
    [
        # fulfilment.order's 21 instances: 6 running with a free lease, 3 failed;
        # 3 live, 3 compensating, 6 finished left.
        (
            "compensate",
            "would change 9 (6 compensation started, 3 compensation tried again)",
            "would skip 12 (3 leased to a runner now, 3 compensating already (a runner "
            "goes on with them), 6 finished)",
        ),
        # 3 stopped, 3 compensating handed over; 3 waiting, 3 live, 9 others left.
        (
            "resume",
            "would change 6 (6 handed to the runners)",
            "would skip 15 (3 waiting for a runner already, 3 leased to a runner now, 9 not "
            "running or compensating)",
        ),
    ],
)
def test_a_dry_run_changes_nothing_and_counts_what_the_run_then_does(
    world, operation, would, skipped
):
    before = rows()

    dry = bulk_sagas(operation, "--name", "fulfilment.order", "--dry-run")

    assert rows() == before
    assert f"dry run: 21 saga instance(s) match; {would}, {skipped}; nothing was changed" in dry
    done = bulk_sagas(operation, "--name", "fulfilment.order")
    assert f"21 saga instance(s) matched: changed {would.removeprefix('would change ')}" in done


def test_progress_is_printed_per_batch_and_the_summary_at_the_end():
    for age in range(5):
        make("billing.charge", "stopped", age, "")

    output = bulk_sagas("resume", "--status", "running", "--batch-size", "2").splitlines()

    assert output[0] == "bulk_sagas resume: status='running'"
    assert output[1] == "batch 1: 2 of 5 — 2 handed to the runners, 0 skipped"
    assert [line.split(":")[0] for line in output[1:4]] == ["batch 1", "batch 2", "batch 3"]
    assert output[-1].startswith(
        "5 saga instance(s) matched: changed 5 (5 handed to the runners), skipped 0"
    )
    assert "3 batch(es)" in output[-1]


def test_every_instance_needs_all(world):
    before = rows()
    bulk_sagas("resume", "--all")
    assert changed_exactly(before, {}, resumed_by_rules) == 12


def test_the_runners_drive_what_a_bulk_operation_handed_them():
    """The command changes no step: a runner (here, what ``recover_sagas`` does)
    resumes the instance whose runner stopped, and undoes the one to compensate."""
    resumed = stopped_after_reserve()
    undone = stopped_after_reserve()
    for instance_id in (resumed, undone):
        # Taken by a runner that died: its lease expired (the only thing a test moves
        # by hand is time passing).
        assert store.claim(store.require(instance_id), "dead", lease_seconds=60) is not None
        SagaInstance.objects.filter(instance_id=instance_id).update(
            leased_until=timezone.now() - timedelta(seconds=5)
        )

    out = bulk_sagas("resume", "--status", "running")
    assert "changed 2 (2 handed to the runners)" in out
    since = store.require(undone).created_at.isoformat()
    out = bulk_sagas("compensate", "--since", since, "--reason", "undo it")
    assert "1 saga instance(s) matched: changed 1 (1 compensation started" in out

    assert runs(resumed) == runs(undone) == ["reserve"]
    stats = drive_pending_sagas()
    assert (stats.succeeded, stats.compensated) == (1, 1)
    assert store.require(resumed).status == SagaStatus.SUCCEEDED
    assert store.require(undone).status == SagaStatus.COMPENSATED
    assert runs(resumed) == ["reserve", "charge", "ship"]
    assert runs(undone, "compensation") == ["reserve"]


# --------------------------------------------------------------------------- bad input


BAD = [
    (["compensate", "--status", "bogus"], "--status must be one of"),
    (["resume", "--since", "yesterday"], "--since must be an ISO 8601"),
    (["compensate", "--since", "2026-03-02", "--until", "2026-03-01"], "must be before --until"),
    (["resume", "--status", "failed", "--batch-size", "0"], "batch size must be between"),
    (["resume", "--all", "--batch-size", "10001"], "batch size must be between"),
    (["compensate", "--name", "bad\nname"], "--name must not contain control characters"),
    (["compensate", "--status", "running", "--reason", "bad \udcff"], "reason contains a lone"),
    (["resume", "--scope", "tenant-a"], "unrecognized arguments: --scope"),
    (["resume", "--tag", "customer=42"], "unrecognized arguments: --tag"),
    (["compensate"], "give at least one filter"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_input_is_refused_and_nothing_is_written(world, args, message):
    before = rows()
    with pytest.raises(CommandError, match=message):
        bulk_sagas(*args)
    assert rows() == before


def test_the_api_raises_typed_errors_and_writes_nothing(world):
    before = rows()
    with pytest.raises(InvalidInput, match="no scope"):
        sagas_bulk.matching(BulkFilter(scope="tenant-a"))
    with pytest.raises(InvalidInput, match="no tags"):
        sagas_bulk.matching(BulkFilter(tags={"customer": "42"}))
    with pytest.raises(InvalidInput, match="reason must not contain NUL"):
        sagas_bulk.compensate_action("a\x00b")
    with pytest.raises(InvalidInput, match="reason must be a str"):
        sagas_bulk.compensate_action(42)  # type: ignore[arg-type]
    everything = sagas_bulk.matching(BulkFilter())
    with transaction.atomic(), pytest.raises(InvalidInput, match=r"transaction\.atomic"):
        run_bulk(everything, sagas_bulk.resume_action(), error=InvalidInput)
    assert rows() == before


def test_bad_input_exits_1_with_the_error_and_writes_nothing(world, tmp_path: Path):
    before = rows()
    command = ManageProcess(tmp_path, "bulk_sagas", "compensate", "--since", "last week")
    try:
        assert command.wait() == 1
        assert "CommandError: --since must be an ISO 8601" in command.output
    finally:
        command.close()
    assert rows() == before


@pytest.mark.postgres_only
def test_a_batch_does_not_wait_for_an_instance_another_transaction_holds(background):
    locked = make("billing.charge", "stopped", 1, "")
    free = make("billing.charge", "stopped", 2, "")
    with held(background, SagaInstance.objects.filter(instance_id=locked)):
        report = run_bulk(
            sagas_bulk.matching(BulkFilter(status="running")),
            sagas_bulk.resume_action(),
            error=InvalidInput,
        )

    assert (report.changed, report.held) == ({store.HANDED_TO_RUNNERS: 1}, 1)
    assert store.require(locked).leased_by == "gone"
    assert store.require(free).leased_by == ""
