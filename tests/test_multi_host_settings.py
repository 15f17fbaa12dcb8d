"""The multi-host ``DATABASES`` of docs/first-deploy.md, as written there: Django's
PostgreSQL backend hands libpq every host and port and ``target_session_attrs``, the
engines' connection defaults keep them, and the django-environ URL the page gives
makes the same settings (the failover test, tests/processes/test_failover.py, runs
the engines through such a URL)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import environ
import pytest
from django.db.utils import ConnectionHandler

from ledon import deadline

PAGE = Path(__file__).resolve().parent.parent / "docs" / "first-deploy.md"


def documented() -> dict[str, Any]:
    """The ``DATABASES`` the page shows for a standby (its one block that sets
    ``target_session_attrs``), run as written."""
    blocks = re.findall(r"```python\n(.*?)```", re.sub(r"\n  ", "\n", PAGE.read_text()), re.S)
    [block] = [b for b in blocks if "target_session_attrs" in b]
    namespace: dict[str, Any] = {}
    exec(block, namespace)
    return namespace["DATABASES"]["default"]


def documented_url() -> str:
    found = re.search(r"`(postgres://[^`]+)`", PAGE.read_text().replace("\n  ", " "))
    assert found is not None
    return found.group(1).replace(" ", "")


@pytest.fixture
def connection():
    handler = ConnectionHandler({"default": documented()})
    yield handler["default"]
    handler.close_all()


def test_libpq_gets_every_host_and_port_and_the_read_write_attribute(connection):
    params = connection.get_connection_params()
    assert params["host"] == "db-a.internal,db-b.internal"
    assert params["port"] == "5432,5432"
    assert params["target_session_attrs"] == "read-write"


def test_the_engines_connection_defaults_keep_them(connection, monkeypatch):
    monkeypatch.setattr(deadline, "connections", {"default": connection})
    deadline.apply_connection_defaults("default", 2.0)
    params = deadline.connection_params(connection)
    assert params["target_session_attrs"] == "read-write"
    assert (params["host"], params["port"]) == ("db-a.internal,db-b.internal", "5432,5432")
    assert params["connect_timeout"] == 2


def test_the_documented_url_makes_the_same_settings():
    config = environ.Env.db_url_config(documented_url())
    expected = documented()
    assert {k: config[k] for k in ("ENGINE", "NAME", "USER", "HOST", "PORT", "OPTIONS")} == {
        k: expected[k] for k in ("ENGINE", "NAME", "USER", "HOST", "PORT", "OPTIONS")
    }
