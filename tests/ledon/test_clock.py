"""The database's clock (``ledon.clock``): how far this host's clock is from the
server's is measured over a round trip, and every engine's time is this host's
clock plus that offset — never ahead of the server's. The server cannot be skewed
here, so this host's clock is (``timezone.now`` as ``ledon.clock`` reads it); the
real thing, a worker under libfaketime, is tests/processes/test_clock_skew.py."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs.worker import Worker
from ledon import clock
from outbox.dispatcher import Dispatcher
from outbox.testing import RecordingTransport
from sagas.runner import SagaRunner

pytestmark = pytest.mark.django_db

SKEW = timedelta(seconds=60)


def server_time() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (found,) = cursor.fetchone()
    return found


@pytest.fixture
def fresh_offset() -> Iterator[None]:
    """The process's offset as it was, after the test (the test process measures none)."""
    before = clock.offset()
    yield
    clock._offset = before


@pytest.fixture
def host_clock_off(monkeypatch: pytest.MonkeyPatch):
    """This host's clock, as ``ledon.clock`` reads it, shifted by ``shift`` seconds."""

    def shift(by: timedelta) -> None:
        real = timezone.now
        monkeypatch.setattr(clock.timezone, "now", lambda: real() + by)

    return shift


def test_without_a_measurement_the_database_clock_is_this_hosts(fresh_offset):
    clock._offset = timedelta(0)
    before = timezone.now()
    assert before <= clock.now() <= timezone.now()


def test_sqlite_has_no_server_clock_to_measure(fresh_offset):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only")
    clock._offset = timedelta(0)
    assert clock.measure("default") is None
    assert clock.align("default") is None
    assert clock.offset() == timedelta(0)


@pytest.mark.postgres_only
def test_clocks_that_agree_within_a_round_trip_get_no_offset(fresh_offset):
    assert clock.measure("default") == timedelta(0)


@pytest.mark.postgres_only
@pytest.mark.parametrize("sign", [1, -1])
def test_a_host_clock_off_by_a_minute_reads_the_servers_time_never_ahead(
    fresh_offset, host_clock_off, caplog, sign
):
    host_clock_off(sign * SKEW)
    caplog.set_level(logging.WARNING, logger="ledon.clock")
    found = clock.align("default")
    assert found is not None
    # The offset undoes the skew, to within a round trip here.
    assert abs(found + sign * SKEW) < timedelta(seconds=1)
    corrected = clock.now()
    assert corrected <= server_time()
    assert server_time() - corrected < timedelta(seconds=1)
    # Said once, with the size and the direction.
    [said] = [r.getMessage() for r in caplog.records]
    direction = "ahead of" if sign > 0 else "behind"
    size = re.match(r"this host's clock is ([0-9.]+) s ", said)
    assert size is not None, said
    assert abs(float(size.group(1)) - SKEW.total_seconds()) < 1, said  # within a round trip
    assert f" s {direction} the database server's" in said, said


@pytest.mark.postgres_only
def test_a_store_without_a_time_and_every_engine_read_the_database_clock(
    fresh_offset, host_clock_off
):
    host_clock_off(SKEW)
    clock.align("default")
    assert clock.current_time(None, error=ValueError) <= server_time()
    engines = [
        Worker(),
        Dispatcher(transport=RecordingTransport()),
        SagaRunner(),
    ]
    for engine in engines:
        assert engine.clock() - server_time() < timedelta(seconds=1)


def test_the_keeper_measures_again_until_closed(fresh_offset, monkeypatch):
    measured: list[str] = []
    monkeypatch.setattr(clock, "align", lambda alias: measured.append(alias))
    keeper = clock.ClockKeeper("default", interval=0.01).start()
    try:
        deadline = timezone.now() + timedelta(seconds=30)
        while len(measured) < 3 and timezone.now() < deadline:
            keeper._closing.wait(0.01)
    finally:
        keeper.close()
    assert measured[:3] == ["default"] * 3
    count = len(measured)
    keeper._closing.wait(0.05)
    assert len(measured) == count  # closed: no more
