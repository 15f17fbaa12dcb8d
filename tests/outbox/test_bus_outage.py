"""The event bus during a database outage: subscribers that fail because the database
is unreachable are logged once per outage, not once per event, as a warning (the
engine that published reports the outage at ERROR)."""

from __future__ import annotations

import logging

from django.db import OperationalError

from outbox import DomainEvent
from outbox.bus import EventBus


class Billed(DomainEvent):
    pass


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_an_unreachable_database_is_one_warning_for_many_events(caplog):
    bus = EventBus()
    down = [True]

    def bill(event: Billed) -> None:
        if down[0]:
            raise OperationalError("connection refused")

    bus.subscribe(Billed, bill)
    caplog.set_level(logging.INFO, logger="outbox.bus")
    results = [bus.publish(Billed()) for _ in range(13)]
    assert all(result.failures for result in results)  # each event still fails
    assert errors(caplog) == []
    outage_lines = [w for w in warnings(caplog) if "database unreachable" in w]
    assert len(outage_lines) == 1
    assert outage_lines[0].startswith("database unreachable: subscriber")
    down[0] = False
    assert not bus.publish(Billed()).failures
    assert any("database reachable again" in r.getMessage() for r in caplog.records)
    down[0] = True
    bus.publish(Billed())
    assert errors(caplog) == []
    # a new outage, a new line
    assert len([w for w in warnings(caplog) if "database unreachable" in w]) == 2


def test_any_other_failure_is_logged_each_time(caplog):
    bus = EventBus()

    def bill(event: Billed) -> None:
        raise ValueError("bad amount")

    bus.subscribe(Billed, bill)
    caplog.set_level(logging.INFO, logger="outbox.bus")
    for _ in range(3):
        bus.publish(Billed())
    assert len(errors(caplog)) == 3
