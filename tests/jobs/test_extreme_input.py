"""Extreme input — a number too long to print, a payload nested thousands deep, a
datetime out of range in UTC, a filter with a lone surrogate — is refused with the
library's typed errors and writes nothing, instead of escaping as a raw Python error
(ValueError, RecursionError, OverflowError, the driver's UnicodeEncodeError)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from jobs import JobScope, JobSubmission, submit_job
from jobs.exceptions import InvalidInput, InvalidPayload
from jobs.models import Job
from outbox import IntegrationEvent, unit_of_work
from outbox.exceptions import InvalidEvent
from outbox.models import OutboxMessage
from sagas import run_saga, start_saga
from sagas.exceptions import InvalidSagaData
from sagas.models import SagaInstance
from sagas.testing import temporary_saga

pytestmark = pytest.mark.django_db(transaction=True)

UTC_MINUS_5 = timezone(timedelta(hours=-5))


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"n": [value]}
    return value


@dataclass(frozen=True)
class Deep(IntegrationEvent, name="test.extreme.deep"):
    tree: Any


def test_a_number_too_long_to_print_is_an_invalid_payload() -> None:
    with pytest.raises(InvalidPayload, match="digits"):
        JobSubmission.create("h.x", 10**5000)
    with pytest.raises(InvalidPayload):
        JobSubmission.create("h.x", {"n": [-(10**5000)]})


def test_a_payload_nested_too_deep_is_an_invalid_payload() -> None:
    with pytest.raises(InvalidPayload, match="nested"):
        JobSubmission.create("h.x", nested(5_000))
    assert JobSubmission.create("h.x", nested(50)).payload == nested(50)
    assert not Job.objects.exists()


def test_not_before_out_of_range_in_utc_is_typed() -> None:
    far = datetime.max.replace(tzinfo=UTC_MINUS_5)
    with pytest.raises(InvalidInput, match="out of range"):
        JobSubmission.create("h.x", not_before=far)


@pytest.mark.parametrize("field", ["queue", "handler"])
def test_a_list_filter_with_a_lone_surrogate_is_typed(field: str) -> None:
    submit_job("tenant-x", "j", JobSubmission.create("h.x"))
    with pytest.raises(InvalidInput):
        JobScope("tenant-x").list(**{field: "a\ud800b"})
    with pytest.raises(InvalidInput):
        JobScope("tenant-x").list(**{field: 7})


def test_an_integration_event_nested_too_deep_is_invalid_and_writes_nothing() -> None:
    with pytest.raises(InvalidEvent, match="nested"), unit_of_work() as uow:
        uow.add_integration_event(Deep(tree=nested(5_000)))
    assert not OutboxMessage.objects.exists()


def test_saga_data_nested_too_deep_is_invalid_and_writes_nothing() -> None:
    with temporary_saga("extreme.deep") as definition:
        definition.step("one", lambda ctx: None)
        with pytest.raises(InvalidSagaData, match="nested"):
            start_saga("extreme.deep", {"tree": nested(5_000)})
        with pytest.raises(InvalidSagaData, match="nested"):
            run_saga("extreme.deep", {"tree": nested(5_000)})
        with pytest.raises(InvalidSagaData):
            run_saga("extreme.deep", {"n": 10**5000})
    assert not SagaInstance.objects.exists()
