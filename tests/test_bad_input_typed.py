"""Bad input: text that one database stores and the other refuses (NUL, lone surrogates,
control characters) is refused with a typed error before anything is written, on
both databases alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from jobs import JobSubmission, submit_job
from jobs.exceptions import InvalidJobId, InvalidScope
from jobs.models import Job
from outbox import IntegrationEvent, unit_of_work
from outbox.exceptions import InvalidEvent
from outbox.exceptions import InvalidInput as OutboxInvalidInput
from outbox.models import OutboxMessage
from outbox.testing import capture_events
from sagas import run_saga, start_saga
from sagas.exceptions import InvalidInput as SagaInvalidInput
from sagas.exceptions import InvalidSagaData
from sagas.models import SagaInstance
from sagas.testing import temporary_saga

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass(frozen=True)
class Noted(IntegrationEvent, name="test.bad_input.noted"):
    text: str


def noop(ctx) -> None:
    pass


@pytest.mark.parametrize("data", [{"note": "a\x00b"}, {"a\x00": 1}, {"l": [{"deep": "\x00"}]}])
def test_saga_data_with_nul_is_refused_and_nothing_is_written(data) -> None:
    with temporary_saga("bad-input.nul") as definition:
        definition.step("one", noop)
        with pytest.raises(InvalidSagaData, match="NUL"):
            start_saga("bad-input.nul", data)
        with pytest.raises(InvalidSagaData, match="NUL"):
            run_saga("bad-input.nul", data)
    assert not SagaInstance.objects.exists()


def test_a_step_writing_nul_into_saga_data_fails_typed() -> None:
    def writes_nul(ctx) -> None:
        ctx.data["note"] = "x\x00y"

    with temporary_saga("bad-input.step") as definition:
        definition.step("one", writes_nul)
        with pytest.raises(Exception) as failure:  # noqa: PT011  (the cause is checked)
            run_saga("bad-input.step", {"ok": 1})
    assert isinstance(failure.value.__cause__, InvalidSagaData)
    assert SagaInstance.objects.get().data == {"ok": 1}


@pytest.mark.parametrize("text", ["\ud800", "ok \udfff ok"])
def test_integration_event_with_a_lone_surrogate_is_refused_and_nothing_is_written(text) -> None:
    with pytest.raises(InvalidEvent, match="lone surrogate"), unit_of_work() as uow:
        uow.add_integration_event(Noted(text=text))
    assert not OutboxMessage.objects.exists()


@dataclass(frozen=True)
class Counted(IntegrationEvent, name="test.bad_input.counted"):
    counts: dict[Any, Any]
    lines: list[Any]


@pytest.mark.parametrize(
    ("counts", "lines", "where"),
    [
        ({1: "a"}, [], r"event\['counts'\] has a key that is not a str: 1 \(int\)"),
        ({"ok": {None: 1}}, [], r"event\['counts'\]\['ok'\] has .*: None \(NoneType\)"),
        ({}, [{"sku": "x"}, {2.5: "y"}], r"event\['lines'\]\[1\] has .*: 2.5 \(float\)"),
        ({True: 1}, [], r"not a str: True \(bool\)"),
    ],
)
@pytest.mark.parametrize("enabled", [True, False])
def test_an_event_dict_key_that_is_not_a_string_is_refused_and_nothing_is_written(
    settings, enabled, counts, lines, where
) -> None:
    """JSON would read ``{1: "a"}`` back as ``{"1": "a"}``: refused, as a job's payload."""
    settings.OUTBOX = {**settings.OUTBOX, "ENABLED": enabled}
    with capture_events(Counted) as published:
        with pytest.raises(InvalidEvent, match=where), unit_of_work() as uow:
            uow.add_integration_event(Counted(counts=counts, lines=lines))
        with unit_of_work() as uow:
            uow.add_integration_event(Counted(counts={"1": "a"}, lines=[]))
    assert [m.event_type for m in OutboxMessage.objects.all()] == (
        ["test.bad_input.counted"] if enabled else []
    )
    assert published == ([] if enabled else [Counted(counts={"1": "a"}, lines=[])])


@pytest.mark.parametrize("scope", ["tenant\x00", "a\nb", "tab\there", "del\x7f"])
def test_scopes_follow_the_job_id_rule_no_control_characters(scope) -> None:
    with pytest.raises(InvalidScope, match="control characters"):
        submit_job(scope, "j", JobSubmission.create("x.y"))
    assert not Job.objects.exists()


# One rule for text fields (ledon.validation.text), each app with its own typed error
# and its own limits: a lone surrogate is refused everywhere, before anything is written.


def test_a_lone_surrogate_in_a_job_id_is_refused_typed() -> None:
    with pytest.raises(InvalidJobId, match="lone surrogate at position 2"):
        submit_job("tenant", "ab\ud800", JobSubmission.create("x.y"))
    assert not Job.objects.exists()


def test_a_lone_surrogate_in_an_idempotency_key_is_refused_typed() -> None:
    with temporary_saga("bad-input.key") as definition:
        definition.step("one", noop)
        with pytest.raises(SagaInvalidInput, match="lone surrogate"):
            start_saga("bad-input.key", {}, idempotency_key="key-\udfff")
    assert not SagaInstance.objects.exists()


def test_a_lone_surrogate_in_a_message_key_is_refused_typed() -> None:
    with pytest.raises(OutboxInvalidInput, match="lone surrogate"), unit_of_work() as uow:
        uow.add_integration_event(Noted(text="fine"), key="k\ud800")
    assert not OutboxMessage.objects.exists()


@pytest.mark.parametrize(
    ("field", "error"),
    [
        # identifiers: no control characters
        (lambda v: submit_job("tenant", v, JobSubmission.create("x.y")), InvalidJobId),
        (lambda v: start_saga("bad-input.lines", {}, idempotency_key=v), SagaInvalidInput),
    ],
)
def test_identifiers_refuse_line_breaks(field, error) -> None:
    with temporary_saga("bad-input.lines") as definition:
        definition.step("one", noop)
        with pytest.raises(error, match="control characters"):
            field("line\nbreak")
    assert not Job.objects.exists()
    assert not SagaInstance.objects.exists()
