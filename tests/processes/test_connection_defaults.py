"""The connection options and the deadline setting of engine processes
(``ledon.deadline``)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from ledon.deadline import (
    CONNECTION_DEFAULTS,
    apply_connection_defaults,
    configured_deadline,
)


@pytest.fixture
def options():
    settings_dict = connections["default"].settings_dict
    saved = dict(settings_dict.get("OPTIONS", {}))
    # Without what an engine run earlier in this process may have set.
    settings_dict["OPTIONS"] = {
        key: value
        for key, value in saved.items()
        if key not in CONNECTION_DEFAULTS and key != "connect_timeout"
    }
    yield settings_dict["OPTIONS"]
    settings_dict["OPTIONS"] = saved


@pytest.mark.postgres_only
def test_engine_connections_get_keepalives_and_timeouts_unless_options_set_them(options):
    options["tcp_user_timeout"] = 5_000
    apply_connection_defaults("default", 4.0)
    assert options["tcp_user_timeout"] == 5_000  # yours wins
    assert options["connect_timeout"] == 4
    for key, value in CONNECTION_DEFAULTS.items():
        if key != "tcp_user_timeout":
            assert options[key] == value


@pytest.mark.postgres_only
def test_the_connect_timeout_is_at_least_libpqs_minimum(options):
    options.pop("connect_timeout", None)
    apply_connection_defaults("default", 0.5)
    assert options["connect_timeout"] == 2


def test_a_sqlite_database_is_left_alone(options):
    if connections["default"].vendor != "sqlite":
        pytest.skip("about SQLite")
    apply_connection_defaults("default", 4.0)
    assert "keepalives" not in options


@pytest.mark.parametrize("value", [0, -1, "10", True])
def test_a_deadline_that_is_not_a_positive_number_is_refused(settings, value):
    settings.LEDON_ROUND_TRIP_DEADLINE = value
    with pytest.raises(ImproperlyConfigured, match="LEDON_ROUND_TRIP_DEADLINE"):
        configured_deadline()


def test_none_turns_the_watchdog_off(settings):
    settings.LEDON_ROUND_TRIP_DEADLINE = None
    assert configured_deadline() is None
    settings.LEDON_ROUND_TRIP_DEADLINE = 3
    assert configured_deadline() == 3.0


def test_the_system_check_names_a_bad_deadline(settings):
    from ledon.checks import check_round_trip_deadline

    settings.LEDON_ROUND_TRIP_DEADLINE = "soon"
    [error] = check_round_trip_deadline()
    assert error.id == "ledon.E002"
    assert "LEDON_ROUND_TRIP_DEADLINE" in error.msg
    settings.LEDON_ROUND_TRIP_DEADLINE = 5
    assert check_round_trip_deadline() == []
