"""Saga definitions and registry, bad input, settings and checks, the documented example,
and running sagas inside an ordinary (non-transactional) test."""

from __future__ import annotations

import logging
import math
import re
import threading
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from sagas import SagaExecutionError, SagaStatus, get_saga, run_saga, saga, start_saga
from sagas.checks import check_outbox_installed, check_sagas_settings
from sagas.conf import sagas_settings
from sagas.exceptions import (
    InvalidInput,
    InvalidSagaData,
    InvalidSagaDefinition,
    SagasConfigurationError,
    StepTimedOut,
    UnknownSaga,
)
from sagas.registry import registered_sagas, unregister
from sagas.testing import drive_pending_sagas, temporary_saga
from testproject.fulfilment.models import Reservation
from tests.support.sagas import ORDER, order, runs

ROOT = Path(__file__).resolve().parents[2]


def noop(ctx) -> None:
    pass


# --------------------------------------------------------------------------- definitions


def test_definitions_are_registered_by_name_at_start_up():
    names = {d.name for d in registered_sagas()}
    assert {"fulfilment.order", "fulfilment.order-with-notice", "fulfilment.timed-order"} <= names
    definition = get_saga("fulfilment.order")
    assert definition.step_names == ("reserve", "charge", "ship")
    reserve, charge, ship = definition.steps
    assert reserve.compensate is not None
    assert charge.compensate is not None
    assert ship.compensate is None
    assert get_saga("fulfilment.timed-order").get_step("charge").timeout == 1.0


def test_the_builder_chains_and_validates():
    with temporary_saga("built") as built:
        assert built.step("a", noop).step("b", noop, compensate=noop, timeout=2) is built
        assert built.step_names == ("a", "b")
        with pytest.raises(InvalidSagaDefinition, match="already has a step 'a'"):
            built.step("a", noop)
        with pytest.raises(InvalidSagaDefinition, match="step name"):
            built.step("bad name", noop)
        with pytest.raises(InvalidSagaDefinition, match="must be callable"):
            built.step("c", "not a function")  # type: ignore[arg-type]
        with pytest.raises(InvalidSagaDefinition, match="compensation must be callable"):
            built.step("c", noop, compensate=42)  # type: ignore[arg-type]
        with pytest.raises(InvalidSagaDefinition, match="timeout"):
            built.step("c", noop, timeout=0)

        async def async_step(ctx) -> None:
            pass

        with pytest.raises(InvalidSagaDefinition, match="async"):
            built.step("c", async_step)  # type: ignore[arg-type]
        assert built.step_names == ("a", "b")


def test_defining_a_name_again_replaces_it_and_warns_across_modules(caplog):
    try:
        first = saga("defined-twice")
        with caplog.at_level(logging.WARNING, logger="sagas"):
            second = saga("defined-twice")
        assert get_saga("defined-twice") is second is not first
        assert not caplog.records  # the same module: a test redefining its saga

        second.module = "someapp.sagas"  # as if another app had defined it
        with caplog.at_level(logging.WARNING, logger="sagas"):
            third = saga("defined-twice")
        assert get_saga("defined-twice") is third
        [warning] = caplog.records
        assert "'defined-twice'" in warning.getMessage()
        assert __name__ in warning.getMessage()
    finally:
        unregister("defined-twice")
    with pytest.raises(InvalidSagaDefinition):
        saga("no spaces allowed")
    with temporary_saga("fulfilment.order") as temporary:
        assert get_saga("fulfilment.order") is temporary
    assert get_saga("fulfilment.order").step_names == ("reserve", "charge", "ship")


@pytest.mark.django_db
def test_unknown_sagas_and_bad_input_are_refused_before_anything_is_written():
    from sagas.models import SagaInstance

    with pytest.raises(UnknownSaga, match="no saga is registered as 'nope'"):
        run_saga("nope")
    with pytest.raises(UnknownSaga):
        start_saga("nope")
    with temporary_saga("empty"), pytest.raises(InvalidSagaDefinition, match="no steps"):
        run_saga("empty")
    bad_data = [
        [1, 2],
        {"x": math.nan},
        {"x": object()},
        {1: "int key"},
        {"nested": {"deep": {2: "x"}}},
        {"x": "\ud800"},
    ]
    for data in bad_data:
        with pytest.raises(InvalidSagaData):
            run_saga("fulfilment.order", data=data)  # type: ignore[arg-type]
    for key in ["", "x" * 201, "tab\tkey", 7]:
        with pytest.raises(InvalidInput):
            run_saga("fulfilment.order", data=ORDER, idempotency_key=key)  # type: ignore[arg-type]
    assert not SagaInstance.objects.exists()


def test_settings_are_validated_and_reported_by_a_system_check(settings):
    assert sagas_settings().LEASE_SECONDS == 30
    assert sagas_settings().heartbeat_seconds == 10
    for bad in (
        {"LEASE_SECONDS": 0},
        {"STEP_TIMEOUT": -1},
        {"COMPENSATION_ATTEMPTS": 0},
        {"HEARTBEAT_SECONDS": 40},
        {"UNKNOWN": 1},
        {"LEASE_SECONDS": True},
    ):
        settings.SAGAS = bad
        with pytest.raises(SagasConfigurationError):
            sagas_settings()
        [error] = check_sagas_settings()
        assert error.id == "sagas.E001"
    settings.SAGAS = {"STEP_TIMEOUT": None, "LEASE_SECONDS": 6}
    assert sagas_settings().STEP_TIMEOUT is None
    assert sagas_settings().heartbeat_seconds == 2
    assert check_sagas_settings() == []


def test_the_outbox_app_is_required(monkeypatch):
    assert check_outbox_installed() == []
    monkeypatch.setattr("sagas.checks.apps.is_installed", lambda name: name != "outbox")
    [error] = check_outbox_installed()
    assert error.id == "sagas.E002"


def test_recover_sagas_refuses_bad_arguments():
    with pytest.raises(CommandError, match="no saga is registered as 'nope'"):
        call_command("recover_sagas", "--burst", "--saga", "nope")
    with pytest.raises(CommandError, match="saga name"):
        call_command("recover_sagas", "--burst", "--saga", "bad name")
    with pytest.raises(CommandError, match="--runner-id must not be empty"):
        call_command("recover_sagas", "--burst", "--runner-id", "")


@pytest.mark.django_db(transaction=True)
def test_recover_sagas_burst_prints_what_it_did(capsys):
    start_saga("fulfilment.order", data=order(order_id=1))
    start_saga("fulfilment.order", data=order(order_id=2, fail_at="charge"))
    call_command("recover_sagas", "--burst", "--runner-id", "cli")
    out = capsys.readouterr().out
    assert out.count("claimed saga fulfilment.order") == 2
    assert "succeeded saga fulfilment.order" in out
    assert "compensated saga fulfilment.order" in out
    assert "claimed 2: succeeded 1, compensated 1" in out


# --------------------------------------------------------------------------- test helpers


@pytest.mark.django_db
def test_sagas_run_inside_an_ordinary_test_transaction():
    """Inside a test case's transaction, steps run on the caller's thread so they see
    (and roll back with) the test's rows."""
    result = run_saga("fulfilment.order", data=ORDER)
    assert result.status is SagaStatus.SUCCEEDED
    assert runs(result.instance_id) == ["reserve", "charge", "ship"]

    with pytest.raises(SagaExecutionError) as caught:
        run_saga("fulfilment.order", data=order(order_id=8, fail_at="ship"))
    assert runs(caught.value.instance_id, "compensation") == ["charge", "reserve"]

    start_saga("fulfilment.order", data=order(order_id=9))
    assert drive_pending_sagas().succeeded == 1
    assert Reservation.objects.filter(released=False).count() == 2


@pytest.mark.django_db
def test_step_timeouts_hold_inside_an_ordinary_test_transaction(settings):
    """Inline, a step that ignores its cancellation is waited for (it borrows the
    test's connection), then treated as failed: its write rolls back and the earlier
    step is compensated."""
    settings.SAGAS = {**settings.SAGAS, "CANCEL_GRACE_SECONDS": 0.1}

    def deaf(ctx) -> None:
        threading.Event().wait(1.0)  # outlives timeout and grace, ignoring the signal
        Reservation.objects.create(order_id=99, sku="late", quantity=1)

    def polite(ctx) -> None:
        ctx.wait_for_cancel(30)
        ctx.raise_if_cancelled()

    undone = []
    for name, step in (("deaf", deaf), ("polite", polite)):
        with temporary_saga(f"inline-{name}") as definition:
            definition.step("first", noop, compensate=lambda ctx: undone.append(ctx.step))
            definition.step(name, step, timeout=0.2)
            with pytest.raises(SagaExecutionError) as caught:
                run_saga(f"inline-{name}")
        assert isinstance(caught.value.__cause__, StepTimedOut)
        assert caught.value.failed_step == name
    assert undone == ["first", "first"]
    assert not Reservation.objects.filter(sku="late").exists()


# --------------------------------------------------------------------------- the docs


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


def test_the_documented_example_is_the_tested_saga():
    """docs/sagas.md's first example is testproject/fulfilment/sagas.py without the
    ``@probed`` test hooks: every line of it appears there."""
    docs = (ROOT / "docs" / "sagas.md").read_text()
    source = (ROOT / "testproject" / "fulfilment" / "sagas.py").read_text()
    code = [line for line in source.splitlines() if "@probed" not in line]
    example = _python_blocks(docs)[0]
    body = [
        line for line in example.splitlines() if not line.startswith(("from ", "import ", "# "))
    ]
    text = "\n".join(code)
    for chunk in "\n".join(body).split("\n\n\n"):
        assert chunk.strip() in text, chunk
