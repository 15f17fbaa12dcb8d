"""Sagas run in one process: steps, data, reverse compensation, needs-attention,
idempotency, timeouts, and what commits with a step — on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
from django.db import transaction

from jobs.models import Job
from outbox.models import OutboxMessage
from outbox.testing import fault_at
from sagas import SagaExecutionError, SagaIdentityConflict, SagaStatus, run_saga, start_saga
from sagas.exceptions import (
    AmbientTransactionError,
    InvalidSagaData,
    RecordedStepFailure,
    StepCancelled,
    StepTimedOut,
)
from sagas.models import SagaInstance
from sagas.testing import drive_pending_sagas, temporary_saga
from testproject.fulfilment.models import Notice, Payment, Reservation, Shipment
from testproject.fulfilment.sagas import PaymentDeclined
from tests.support.procs import wait_until
from tests.support.sagas import ORDER, instance, order, runs, started

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def quick_retries(settings):
    settings.SAGAS = {**settings.SAGAS, "COMPENSATION_RETRY_DELAY": 0}


# --------------------------------------------------------------------------- happy path


def test_happy_path_runs_every_step_once_in_order_and_persists_data():
    result = run_saga("fulfilment.order", data=ORDER, idempotency_key="order-7")

    assert result.status is SagaStatus.SUCCEEDED
    assert result.created
    assert result.name == "fulfilment.order"
    assert result.completed_steps == ("reserve", "charge", "ship")
    reservation, payment, shipment = (
        Reservation.objects.get(),
        Payment.objects.get(),
        Shipment.objects.get(),
    )
    assert result.data == {
        **ORDER,
        "reservation_id": reservation.pk,
        "payment_id": payment.pk,
        "shipment_id": shipment.pk,
    }
    # Each step read what the earlier ones wrote into the data.
    assert payment.reservation_id == reservation.pk
    assert shipment.payment_id == payment.pk
    assert runs(result.instance_id) == ["reserve", "charge", "ship"]
    assert runs(result.instance_id, "compensation") == []

    row = instance(result.instance_id)
    assert row.status == SagaStatus.SUCCEEDED
    assert row.steps == row.completed_steps == ["reserve", "charge", "ship"]
    assert row.data == result.data
    assert (row.leased_by, row.leased_until) == ("", None)
    assert row.finished_at is not None
    assert row.version == 3  # one completion mark per step, nothing else
    assert row.idempotency_key == "order-7"


def test_a_step_stages_a_job_and_emits_an_integration_event_committed_with_it():
    result = run_saga("fulfilment.order", data=ORDER)

    shipment = Shipment.objects.get()
    job = Job.objects.get()
    assert (job.job_id, job.handler) == (f"dispatch-{result.instance_id}", "fulfilment.dispatch")
    assert json.loads(job.payload_json) == {"shipment_id": shipment.pk}
    message = OutboxMessage.objects.get()
    assert message.event_type == "fulfilment.shipment_requested"
    assert message.key == "7"
    assert json.loads(message.payload_json) == {"order_id": 7, "shipment_id": shipment.pk}


@pytest.mark.parametrize(
    "point", ["fulfilment.ship.inside", "sagas.step.marked"], ids=["in-step", "after-mark"]
)
def test_a_step_failing_after_staging_commits_neither_job_nor_event_nor_mark(point):
    """The failure comes after the rows, the job, the event and (for "after-mark") the
    completion mark were written in the step's transaction: all of them roll back."""
    with (
        fault_at(point, RuntimeError("crash"), when=lambda c: c["step"] == "ship"),
        pytest.raises(SagaExecutionError) as caught,
    ):
        run_saga("fulfilment.order", data=ORDER)

    assert caught.value.failed_step == "ship"
    assert (Shipment.objects.count(), Job.objects.count(), OutboxMessage.objects.count()) == (
        0,
        0,
        0,
    )
    row = instance()
    assert row.completed_steps == ["reserve", "charge"]
    assert row.compensated_steps == ["charge", "reserve"]
    assert runs(row.instance_id) == ["reserve", "charge"]


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("fail_at", "completed"),
    [("reserve", []), ("charge", ["reserve"]), ("ship", ["reserve", "charge"])],
)
def test_failure_at_each_step_compensates_completed_steps_in_reverse(fail_at, completed):
    with pytest.raises(SagaExecutionError) as caught:
        run_saga("fulfilment.order", data=order(fail_at=fail_at), idempotency_key="k")

    error = caught.value
    assert error.saga_name == "fulfilment.order"
    assert error.failed_step == fail_at
    assert error.status is SagaStatus.COMPENSATED
    assert isinstance(error.__cause__, PaymentDeclined)
    assert f"step {fail_at!r} failed" in str(error)
    row = instance(error.instance_id)
    assert row.status == SagaStatus.COMPENSATED
    assert row.failed_step == fail_at
    assert "PaymentDeclined: injected failure" in row.error
    assert row.completed_steps == completed
    assert row.compensated_steps == completed[::-1]
    assert (row.leased_by, row.leased_until) == ("", None)
    # The failed step's own rows rolled back with its transaction; compensations ran
    # once each, latest step first.
    assert runs(row.instance_id) == completed
    assert runs(row.instance_id, "compensation") == completed[::-1]
    assert Reservation.objects.filter(released=False).count() == 0
    assert Reservation.objects.count() == (1 if completed else 0)
    assert Payment.objects.filter(refunded=False).count() == 0
    assert Payment.objects.count() == (1 if "charge" in completed else 0)
    assert Shipment.objects.count() == 0


def test_a_step_without_compensation_logs_a_warning_and_compensation_continues(caplog):
    with caplog.at_level(logging.WARNING, logger="sagas"), pytest.raises(SagaExecutionError):
        run_saga("fulfilment.order-with-notice", data=order(fail_at="charge"))

    row = instance()
    assert row.status == SagaStatus.COMPENSATED
    assert row.completed_steps == ["reserve", "notify"]
    assert row.uncompensated_steps == ["notify"]
    assert row.compensated_steps == ["reserve"]
    assert Reservation.objects.get().released
    assert Notice.objects.count() == 1  # nothing could take it back
    warnings = [r for r in caplog.records if "has no compensation" in r.getMessage()]
    assert len(warnings) == 1
    assert "'notify'" in warnings[0].getMessage()
    assert warnings[0].step == "notify"


def test_a_compensation_that_keeps_failing_leaves_the_instance_needing_attention(settings):
    settings.SAGAS = {**settings.SAGAS, "COMPENSATION_ATTEMPTS": 2}
    data = order(fail_at="ship", fail_compensation={"reserve": 2})
    with pytest.raises(SagaExecutionError) as caught:
        run_saga("fulfilment.order", data=data)

    assert caught.value.status is SagaStatus.FAILED
    assert caught.value.failed_step == "ship"
    assert "needs attention" in str(caught.value)
    row = instance()
    assert row.status == SagaStatus.FAILED
    assert row.compensated_steps == ["charge"]  # the refund worked, the release did not
    assert "compensation of step 'reserve' failed 2 time(s)" in row.compensation_error
    assert "injected failure compensating reserve" in row.compensation_error
    assert "PaymentDeclined" in row.error
    assert (row.leased_by, row.leased_until) == ("", None)
    assert not Reservation.objects.get().released
    assert Payment.objects.get().refunded
    # Needs attention is not active: recovery leaves it alone.
    assert drive_pending_sagas().claimed == 0

    # An operator fixes the cause and compensates again: the third try succeeds.
    settings.SAGAS = {**settings.SAGAS, "COMPENSATION_ATTEMPTS": 3}
    from sagas import compensate_saga

    final = compensate_saga(row.instance_id)
    assert final.status is SagaStatus.COMPENSATED
    assert final.compensated_steps == ("charge", "reserve")
    assert final.compensation_error == ""
    assert Reservation.objects.get().released
    assert runs(row.instance_id, "compensation") == ["charge", "reserve"]


def test_a_compensation_failing_once_is_tried_again(caplog):
    data = order(fail_at="ship", fail_compensation={"charge": 1})
    with (
        caplog.at_level(logging.WARNING, logger="sagas"),
        pytest.raises(SagaExecutionError) as caught,
    ):
        run_saga("fulfilment.order", data=data)
    assert caught.value.status is SagaStatus.COMPENSATED
    assert runs(caught.value.instance_id, "compensation") == ["charge", "reserve"]
    assert any("try 1 of 3" in r.getMessage() for r in caplog.records)


def test_data_a_step_leaves_must_stay_json():
    def spoil(ctx):
        ctx.data["when"] = object()

    def undo(ctx):
        ctx.data["undone"] = True

    with temporary_saga("spoiler") as spoiler:
        spoiler.step("first", lambda ctx: None, compensate=undo).step("spoil", spoil)
        with pytest.raises(SagaExecutionError) as caught:
            run_saga("spoiler", data={"n": 1})
    assert isinstance(caught.value.__cause__, InvalidSagaData)
    row = instance()
    assert row.failed_step == "spoil"
    assert row.data == {"n": 1, "undone": True}  # the compensation's data is kept


# --------------------------------------------------------------------------- idempotency


def test_the_same_key_returns_the_existing_instance_and_never_runs_twice():
    first = run_saga("fulfilment.order", data=ORDER, idempotency_key="order-7")
    # The same data in another key order is the same request.
    again = run_saga(
        "fulfilment.order", data=dict(reversed(ORDER.items())), idempotency_key="order-7"
    )

    assert again.instance_id == first.instance_id
    assert not again.created
    assert again.status is SagaStatus.SUCCEEDED
    assert again.data == first.data  # the stored run's data, as its steps left it
    assert runs(first.instance_id) == ["reserve", "charge", "ship"]
    assert Reservation.objects.count() == 1

    # Another saga may use the same key: keys are per saga name.
    other = run_saga("fulfilment.order-with-notice", data=ORDER, idempotency_key="order-7")
    assert other.instance_id != first.instance_id


def test_the_same_key_with_other_data_is_a_conflict_that_runs_nothing():
    first = run_saga("fulfilment.order", data=ORDER, idempotency_key="order-7")
    with pytest.raises(SagaIdentityConflict, match="order-7") as conflict:
        run_saga("fulfilment.order", data={**ORDER, "quantity": 99}, idempotency_key="order-7")
    assert (conflict.value.name, conflict.value.idempotency_key) == ("fulfilment.order", "order-7")
    with pytest.raises(SagaIdentityConflict):
        start_saga("fulfilment.order", data={**ORDER, "quantity": 99}, idempotency_key="order-7")
    assert SagaInstance.objects.count() == 1
    assert runs(first.instance_id) == ["reserve", "charge", "ship"]
    assert Reservation.objects.count() == 1


def test_repeating_a_failed_run_raises_its_outcome_again_without_running():
    with pytest.raises(SagaExecutionError) as first:
        run_saga("fulfilment.order", data=order(fail_at="charge"), idempotency_key="k")
    with pytest.raises(SagaExecutionError) as again:
        run_saga("fulfilment.order", data=order(fail_at="charge"), idempotency_key="k")

    assert again.value.instance_id == first.value.instance_id
    assert again.value.failed_step == "charge"
    assert isinstance(again.value.__cause__, RecordedStepFailure)
    assert "PaymentDeclined" in str(again.value.__cause__)
    assert runs(first.value.instance_id) == ["reserve"]
    assert runs(first.value.instance_id, "compensation") == ["reserve"]


def test_concurrent_requests_with_one_key_run_the_business_once(concurrently, tmp_path):
    data = order(journal=str(tmp_path / "journal"))
    outcomes = concurrently(
        *[lambda: run_saga("fulfilment.order", data=data, idempotency_key="once")] * 4
    )

    assert [o.error for o in outcomes] == [None] * 4
    snapshots = [o.value for o in outcomes]
    assert len({s.instance_id for s in snapshots}) == 1
    assert sum(s.created for s in snapshots) == 1
    # The others saw the instance running (driven by the first) or already done.
    assert {s.status for s in snapshots} <= {SagaStatus.RUNNING, SagaStatus.SUCCEEDED}
    assert runs(snapshots[0].instance_id) == ["reserve", "charge", "ship"]
    assert started(tmp_path / "journal") == {"reserve": 1, "charge": 1, "ship": 1}


# --------------------------------------------------------------------------- transactions


def test_run_saga_refuses_to_run_inside_a_transaction_and_start_saga_joins_it():
    with pytest.raises(AmbientTransactionError), transaction.atomic():
        run_saga("fulfilment.order", data=ORDER)

    def business_fails_after_starting_a_saga() -> None:
        with transaction.atomic():
            start_saga("fulfilment.order", data=ORDER, idempotency_key="rolled-back")
            raise RuntimeError("the business transaction fails")

    with pytest.raises(RuntimeError):
        business_fails_after_starting_a_saga()
    assert not SagaInstance.objects.exists()


def test_start_saga_records_an_instance_that_recovery_drives():
    with transaction.atomic():
        snap = start_saga("fulfilment.order", data=ORDER, idempotency_key="bg-7")
    assert snap.created
    assert snap.status is SagaStatus.RUNNING
    assert (snap.leased_by, snap.leased_until) == ("", None)
    assert runs(snap.instance_id) == []
    assert not start_saga("fulfilment.order", data=ORDER, idempotency_key="bg-7").created

    stats = drive_pending_sagas()

    assert (stats.claimed, stats.succeeded) == (1, 1)
    assert instance(snap.instance_id).status == SagaStatus.SUCCEEDED
    assert runs(snap.instance_id) == ["reserve", "charge", "ship"]


# --------------------------------------------------------------------------- timeouts


def test_a_step_ignoring_its_cancellation_is_failed_and_its_late_completion_fenced(
    settings, tmp_path: Path
):
    """charge has its own 1 s timeout (``fulfilment.timed-order``) and ignores its cancellation.
    The runner stops waiting, compensates reserve and raises; when the late step finally
    writes its payment and tries to mark itself completed, its transaction cannot
    commit: the payment never exists."""
    settings.SAGAS = {**settings.SAGAS, "CANCEL_GRACE_SECONDS": 0.2}
    hold = {"step": "charge", "file": str(tmp_path / "release"), "obey_cancel": False}
    data = order(hold=hold, journal=str(tmp_path / "journal"))

    with pytest.raises(SagaExecutionError) as caught:
        run_saga("fulfilment.timed-order", data=data)

    cause = caught.value.__cause__
    assert isinstance(cause, StepTimedOut)
    assert "ignored its cancellation" in str(cause)
    assert caught.value.failed_step == "charge"
    row = instance()
    assert row.status == SagaStatus.COMPENSATED
    assert row.compensated_steps == ["reserve"]
    assert Reservation.objects.get().released
    version = row.version

    # Let the late step go on: it writes its payment, then its completion is refused.
    (tmp_path / "release").touch()

    def late_step_ended() -> bool:
        lines = (tmp_path / "journal").read_text().splitlines()
        return any(" charge action end " in line + " " for line in lines)

    wait_until(late_step_ended, 10, "the late step to end")
    assert Payment.objects.count() == 0
    assert runs(row.instance_id) == ["reserve"]
    row.refresh_from_db()
    assert (row.status, row.version, row.completed_steps) == (
        SagaStatus.COMPENSATED,
        version,
        ["reserve"],
    )


def test_global_timeout_cancels_a_cooperative_step(settings, tmp_path: Path):
    settings.SAGAS = {**settings.SAGAS, "STEP_TIMEOUT": 0.3, "CANCEL_GRACE_SECONDS": 5}
    hold = {"step": "charge", "file": str(tmp_path / "never"), "obey_cancel": True}

    with pytest.raises(SagaExecutionError) as caught:
        run_saga("fulfilment.order", data=order(hold=hold))

    cause = caught.value.__cause__
    assert isinstance(cause, StepTimedOut)
    assert isinstance(cause.__cause__, StepCancelled)
    assert instance().compensated_steps == ["reserve"]
    assert Payment.objects.count() == 0


def test_step_context_carries_identity_and_its_own_unit_of_work():
    seen = {}

    def look(ctx):
        seen.update(
            instance_id=ctx.instance_id,
            saga=ctx.saga_name,
            step=ctx.step,
            compensating=ctx.compensating,
            uow_active=ctx.unit_of_work.active,
            cancel=ctx.cancel_requested,
            thread=threading.current_thread().name,
        )

    with temporary_saga("look") as look_saga:
        look_saga.step("look", look)
        result = run_saga("look")
    assert seen == {
        "instance_id": result.instance_id,
        "saga": "look",
        "step": "look",
        "compensating": False,
        "uow_active": True,
        "cancel": False,
        # A step thread, not the caller's: the driver can give up on it after its timeout.
        "thread": f"saga-steps-{threading.current_thread().name}",
    }
