"""Round-trip deadlines (``ledon.deadline``): a connection that goes silent fails
instead of waiting for ever, and a slow statement on a live connection is left alone.

Each test puts the fault proxy (``support.proxy``) between one psycopg connection and
the test's PostgreSQL server and watches the connection with a watchdog of a short
deadline.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from ledon.deadline import Watchdog, probe_backends, watch
from tests.support.procs import wait_until
from tests.support.proxy import FaultProxy

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]

DEADLINE = 1.0


def params(port: int | None = None) -> dict[str, Any]:
    s = connection.settings_dict
    return {
        "host": "127.0.0.1",
        "port": port or int(s["PORT"]),
        "dbname": s["NAME"],
        "user": s["USER"] or "postgres",
        **({"password": s["PASSWORD"]} if s.get("PASSWORD") else {}),
    }


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    with FaultProxy(int(connection.settings_dict["PORT"])) as started:
        yield started


@pytest.fixture
def dog() -> Iterator[Watchdog]:
    watchdog = Watchdog(DEADLINE)
    yield watchdog
    watchdog.close()


def patient_probe(params: Any, pids: list[int], timeout: float) -> dict[int, str] | None:
    """The watchdog's own probe, given a minute: where the server's answer decides
    (a statement still running is left alone), a busy machine's slow new connection
    must not be taken for a server that does not answer."""
    return probe_backends(params, pids, 60)


@pytest.fixture
def patient_dog() -> Iterator[Watchdog]:
    watchdog = Watchdog(DEADLINE, probe=patient_probe)
    yield watchdog
    watchdog.close()


def connect(port: int, dog: Watchdog) -> psycopg.Connection[Any]:
    conn = psycopg.connect(**params(port), autocommit=True)
    watch(conn, params(port), by=dog)
    return conn


@pytest.mark.parametrize("fault", ["black_hole", "hold"])
def test_a_round_trip_on_a_silent_connection_fails(proxy, dog, fault):
    conn = connect(proxy.port, dog)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    getattr(proxy, fault)()
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 2")
    assert dog.broken == 1
    conn.close()
    proxy.forward()


def test_a_commit_whose_reply_never_comes_fails(proxy, dog):
    conn = connect(proxy.port, dog)
    conn.autocommit = False
    conn.execute("SELECT 1")
    proxy.black_hole()
    with pytest.raises(psycopg.OperationalError):
        conn.commit()
    assert dog.broken == 1


def test_a_slow_statement_on_a_live_connection_is_left_alone(patient_dog):
    conn = psycopg.connect(**params(), autocommit=True)
    watch(conn, params(), by=patient_dog)
    # Three deadlines long: the watchdog asks the server each time and hears "active".
    assert conn.execute("SELECT pg_sleep(%s), 7", [3 * DEADLINE]).fetchone() == ("", 7)
    assert patient_dog.broken == 0
    conn.close()


def test_a_statement_waiting_on_a_lock_is_left_alone():
    now = [0.0]
    dog = Watchdog(DEADLINE, clock=lambda: now[0], probe=patient_probe)
    holder = psycopg.connect(**params())
    holder.execute("CREATE TABLE IF NOT EXISTS deadline_lock (id int)")
    holder.commit()
    holder.execute("LOCK TABLE deadline_lock IN ACCESS EXCLUSIVE MODE")
    waiter = psycopg.connect(**params(), autocommit=True)
    watch(waiter, params(), by=dog)
    thread = threading.Thread(target=lambda: waiter.execute("SELECT count(*) FROM deadline_lock"))
    thread.start()
    wait_until(
        lambda: holder.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
            [waiter.pgconn.backend_pid],
        ).fetchone(),
        what="the statement to wait on the lock",
    )
    for _ in range(3):
        now[0] += 2 * DEADLINE
        assert dog.check() == 0
    holder.rollback()
    thread.join(30)
    assert not thread.is_alive()
    assert dog.broken == 0
    holder.execute("DROP TABLE deadline_lock")
    holder.commit()
    holder.close()
    waiter.close()
    dog.close()


def test_a_wait_for_notifications_is_no_round_trip(dog):
    conn = psycopg.connect(**params(), autocommit=True)
    watch(conn, params(), by=dog)
    conn.execute("LISTEN deadline_quiet")
    # Three deadlines without a notification: a quiet channel, not a silent link.
    assert list(conn.notifies(timeout=3 * DEADLINE)) == []
    assert dog.broken == 0
    assert conn.execute("SELECT 1").fetchone() == (1,)
    conn.close()


def test_behind_a_pooler_only_an_unreachable_server_breaks_a_round_trip():
    now = [0.0]
    answers: list[dict[int, str] | None] = [{}]  # the server answers; no such backend
    dog = Watchdog(DEADLINE, clock=lambda: now[0], probe=lambda *args: answers[0])
    pooled_a, pooled_b = socket.socketpair()
    direct_a, direct_b = socket.socketpair()
    pooled = dog.begin({"host": "pooler"}, 111, pooled_a.fileno(), pooled=True)
    direct = dog.begin({"host": "server"}, 222, direct_a.fileno())
    now[0] += 2 * DEADLINE
    assert dog.check() == 1  # the direct one: its backend is gone
    assert direct_b.recv(10) == b""  # shut down
    dog.end(direct)  # (its wait fails and ends)
    answers[0] = None  # now the server does not answer
    now[0] += 2 * DEADLINE
    assert dog.check() == 1
    assert pooled_b.recv(10) == b""
    dog.end(pooled)
    for sock in (pooled_a, pooled_b, direct_a, direct_b):
        sock.close()
    dog.close()
