"""The event bus during a database outage: subscribers that fail because the database
is unreachable are logged once per outage, not once per event."""

from __future__ import annotations

import logging

from django.db import OperationalError

from outbox import DomainEvent
from outbox.bus import EventBus


class Billed(DomainEvent):
    pass


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_unreachable_database_is_one_error_line_for_many_events(caplog):
    bus = EventBus()
    down = [True]

    def bill(event: Billed) -> None:
        if down[0]:
            raise OperationalError("connection refused")

    bus.subscribe(Billed, bill)
    caplog.set_level(logging.INFO, logger="outbox.bus")
    results = [bus.publish(Billed()) for _ in range(13)]
    assert all(result.failures for result in results)  # each event still fails
    assert len(errors(caplog)) == 1
    assert "database unreachable: subscriber" in errors(caplog)[0]
    down[0] = False
    assert not bus.publish(Billed()).failures
    assert any("database reachable again" in r.getMessage() for r in caplog.records)
    down[0] = True
    bus.publish(Billed())
    assert len(errors(caplog)) == 2  # a new outage, a new line


def test_any_other_failure_is_logged_each_time(caplog):
    bus = EventBus()

    def bill(event: Billed) -> None:
        raise ValueError("bad amount")

    bus.subscribe(Billed, bill)
    caplog.set_level(logging.INFO, logger="outbox.bus")
    for _ in range(3):
        bus.publish(Billed())
    assert len(errors(caplog)) == 3
