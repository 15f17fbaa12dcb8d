"""Real brokers and a second service for the broker tests.

Brokers come from the environment (``RABBITMQ_URL``, ``KAFKA_BOOTSTRAP`` and
``BROKERS_DIR``, as ``scripts/test.sh`` exports them after ``scripts/brokers.sh
start``); otherwise, when the brokers are installed, they are started once for this
test process in a private directory. A broker that cannot be had (not installed, or
its Python client missing: the ``brokers-test`` extra) skips its tests —
and fails them when ``CI=true``, so that CI never passes without them.

Under pytest-xdist the tests that use one broker run on one worker, in that broker's
group (``uses_broker``): one of them stops the shared broker and starts it again, and
no other test of that broker may run meanwhile. The two brokers' groups run side by
side.

Service B is the same project with another database and its own ``DATABASE_URL``;
its tables are read with plain database connections.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.support.procs import ROOT, ManageProcess, manage, wait_until

SCRIPT = ROOT / "scripts" / "brokers.sh"


def uses_broker(kind: str) -> pytest.MarkDecorator:
    """The mark of a test that uses the shared broker ``kind`` (its xdist group)."""
    return pytest.mark.xdist_group(f"broker-{kind}")


#: Parameters "rabbitmq" and "kafka" (of a test or fixture), each in its group.
EACH_BROKER = [pytest.param(kind, marks=uses_broker(kind)) for kind in ("rabbitmq", "kafka")]
ENV_NAMES = {"rabbitmq": "RABBITMQ_URL", "kafka": "KAFKA_BOOTSTRAP"}
#: The client each broker's transport imports (the ``rabbitmq`` and ``kafka`` extras).
CLIENTS = {"rabbitmq": "pika", "kafka": "confluent_kafka"}
IN_CI = os.environ.get("CI") == "true"


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: broker tests must run)")
    pytest.skip(reason)


@dataclass
class Broker:
    """One running broker: its address, and the directory to stop and start it."""

    kind: str
    address: str
    directory: Path | None

    def stop(self) -> None:
        self._script("stop")

    def start(self) -> None:
        self._script("start")

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        """The broker stopped for the block, and started again however it ends: a
        failing test never leaves the shared broker down for the tests after it."""
        self.stop()
        try:
            yield
        finally:
            self.start()

    def start_again(self) -> None:
        """Start the broker if it is down; one still running but slow to answer is
        waited for instead."""
        self._script("start", running_is_fine=True)
        wait_until(self.listening, timeout=60, what=f"{self.kind} to listen again")

    def listening(self) -> bool:
        """Whether the broker's port takes a connection."""
        address = self.address if "//" in self.address else f"//{self.address.split(',')[0]}"
        parts = urlsplit(address)
        try:
            with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 2):
                return True
        except OSError:
            return False

    def _script(self, command: str, *, running_is_fine: bool = False) -> None:
        if self.directory is None:
            unavailable(f"{self.kind} was given without BROKERS_DIR: cannot stop or start it")
        result = subprocess.run(
            [str(SCRIPT), command, str(self.directory), self.kind],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if running_is_fine and "already running" in result.stderr:
            return
        assert result.returncode == 0, f"brokers.sh {command} {self.kind}:\n{result.stderr}"


_started: dict[str, Broker | str] = {}


def broker(kind: str) -> Broker:
    """The broker ``kind`` ("rabbitmq" or "kafka"), or skip (fail in CI)."""
    found = _started.get(kind)
    if found is None:
        found = _started[kind] = _find_or_start(kind)
    if isinstance(found, str):
        unavailable(found)
        raise AssertionError("unreachable")
    if found.directory is not None and not found.listening():
        found.start_again()  # a test before this one left it stopped
    return found


def require_client(kind: str) -> None:
    """Skip (fail in CI) unless the client of broker ``kind`` is installed."""
    if (missing := _missing_client(kind)) is not None:
        unavailable(missing)


def _missing_client(kind: str) -> str | None:
    if importlib.util.find_spec(CLIENTS[kind]) is None:
        return f"{kind}: its client {CLIENTS[kind]!r} is not installed (the brokers-test extra)"
    return None


def _find_or_start(kind: str) -> Broker | str:
    if (missing := _missing_client(kind)) is not None:
        # The processes under test would refuse to start (a system check error).
        return missing
    address = os.environ.get(ENV_NAMES[kind])
    if address:
        directory = os.environ.get("BROKERS_DIR")
        return Broker(kind, address, Path(directory) if directory else None)
    directory = Path(tempfile.mkdtemp(prefix=f"ledon-{kind}-"))
    result = subprocess.run(
        [str(SCRIPT), "start", str(directory), kind], capture_output=True, text=True, timeout=120
    )
    if result.returncode != 0:
        shutil.rmtree(directory, ignore_errors=True)
        return f"{kind} is not available here: {result.stderr.strip()[-500:]}"
    atexit.register(
        subprocess.run, [str(SCRIPT), "stop", str(directory)], capture_output=True, timeout=120
    )
    line = result.stdout.strip().splitlines()[-1]
    return Broker(kind, line.partition("=")[2], directory)


def transport_env(broker: Broker, options: dict[str, Any]) -> dict[str, str]:
    """Environment of a process that uses ``broker`` through the outbox transport."""
    import json

    return {
        "OUTBOX_ENABLED": "true",
        "OUTBOX_TRANSPORT": broker.kind,
        ENV_NAMES[broker.kind]: broker.address,
        "OUTBOX_TRANSPORT_OPTIONS": json.dumps(options),
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def read_kafka_topic(address: str, topic: str, count: int) -> list[Any]:
    """The first ``count`` records of every partition of ``topic`` (no consumer group:
    partitions are assigned, which is quick)."""
    import confluent_kafka

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": address, "group.id": unique("reader"), "log_level": 2}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in partitions
            ]
        )
        found: list[Any] = []

        def read() -> bool:
            record = consumer.poll(0.2)
            if record is not None and record.error() is None:
                found.append(record)
            return len(found) >= count

        wait_until(read, 30, f"{count} records in {topic!r}")
        return found
    finally:
        consumer.close()


# --------------------------------------------------------------------------- processes


class ManageCommand(ManageProcess):
    """``manage.py <command> -v 2 …`` for one service of a broker test; a failure
    shows the output of its sibling processes too."""

    def __init__(
        self,
        tmp_path: Path,
        command: str,
        *args: str,
        env: dict[str, str],
        database_url: str,
        siblings: Sequence[ManageCommand] = (),
    ) -> None:
        #: Processes of the same test, whose output a failure shows too.
        self.siblings = siblings
        super().__init__(tmp_path, command, "-v", "2", *args, env=env, database=database_url)

    def wait_for_output(self, text: str, timeout: float = 60) -> None:
        self.wait_until(lambda: text in self.output, f"{self.name} output {text!r}", timeout)

    def wait_until(self, condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
        def check() -> Any:
            if self.proc.poll() is not None and not condition():
                raise AssertionError(
                    f"{self.name} exited with {self.proc.returncode} while waiting for "
                    f"{what}:\n{self.output}"
                )
            return condition()

        try:
            return wait_until(check, timeout, what)
        except AssertionError as exc:
            outputs = "".join(
                f"\n--- {proc.name} output:\n{proc.output}"
                for proc in [self, *(p for p in self.siblings if p is not self)]
            )
            raise AssertionError(f"{exc}{outputs}") from None

    def terminate(self, timeout: float = 60) -> int:
        self.proc.terminate()
        return self.wait(timeout)


@dataclass
class Processes:
    tmp_path: Path
    started: list[ManageCommand] = field(default_factory=list)

    def start(
        self, command: str, *args: str, env: dict[str, str], database_url: str
    ) -> ManageCommand:
        proc = ManageCommand(
            self.tmp_path,
            command,
            *args,
            env=env,
            database_url=database_url,
            siblings=self.started,
        )
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            proc.close()


# --------------------------------------------------------------------------- service B


class ServiceDatabase:
    """Service B's own database: created, migrated by ``manage.py migrate`` in a child
    process, read with a plain connection, dropped at the end."""

    def __init__(self, url: str, drop: Callable[[], None]) -> None:
        self.url = url
        self._drop = drop

    @classmethod
    def beside(cls, a_url: str, folder: Path) -> ServiceDatabase:
        """A new database next to service A's: a second SQLite file, or a second
        database on A's PostgreSQL server."""
        if a_url.startswith("sqlite"):
            path = folder / "service-b.sqlite3"
            return cls(f"sqlite:///{path}", lambda: None)
        import psycopg
        from psycopg import sql

        name = f"ledon_b_{uuid.uuid4().hex[:10]}"
        admin = a_url

        def execute(statement: Any) -> None:
            with psycopg.connect(_conninfo(admin), autocommit=True) as conn:
                conn.execute(statement)

        execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        parts = urlsplit(a_url)
        url = parts._replace(path=f"/{name}").geturl()
        return cls(
            url,
            lambda: execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name))),
        )

    def migrate(self) -> None:
        manage(self.url, "migrate", "-v", "0")

    def rows(self, query: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of ``query`` (with ``%s`` placeholders) in a fresh connection."""
        if self.url.startswith("sqlite"):
            path = self.url.removeprefix("sqlite:///")
            with sqlite3.connect(path, timeout=30) as conn:
                return list(conn.execute(query.replace("%s", "?"), params).fetchall())
        import psycopg

        with psycopg.connect(_conninfo(self.url)) as conn:
            return list(conn.execute(query, params).fetchall())  # type: ignore[arg-type]

    def inbox_ids(self, group: str) -> set[str]:
        rows = self.rows("SELECT message_id FROM outbox_inboxmessage WHERE consumer = %s", [group])
        return {r[0] for r in rows}

    def invoices(self, prefix: str) -> list[tuple[str, str]]:
        """(order number, message id) of the invoices for orders starting with ``prefix``."""
        return [
            (r[0], r[1])
            for r in self.rows(
                "SELECT order_number, message_id FROM orders_invoice WHERE order_number LIKE %s"
                " ORDER BY order_number",
                [f"{prefix}%"],
            )
        ]

    def handled_orders(self, prefix: str) -> list[tuple[str, bool]]:
        """(order number, fresh) of every run of the billing subscriber for orders
        starting with ``prefix``, in the order the runs committed."""
        rows = self.rows(
            "SELECT i.order_number, d.fresh FROM orders_delivery d"
            " JOIN orders_invoice i ON i.message_id = d.message_id"
            " WHERE i.order_number LIKE %s ORDER BY d.id",
            [f"{prefix}%"],
        )
        return [(r[0], bool(r[1])) for r in rows]

    def deliveries(self, message_ids: set[str]) -> list[tuple[str, bool]]:
        """(message id, fresh) of every run of the billing subscriber for these ids."""
        rows = self.rows("SELECT message_id, fresh FROM orders_delivery")
        return [(r[0], bool(r[1])) for r in rows if r[0] in message_ids]

    def outbox_count(self, event_type: str, keys: set[str]) -> int:
        rows = self.rows("SELECT key FROM outbox_outboxmessage WHERE event_type = %s", [event_type])
        return sum(1 for r in rows if r[0] in keys)

    def drop(self) -> None:
        self._drop()


def _conninfo(url: str) -> str:
    parts = urlsplit(url)
    return (
        f"host={parts.hostname} port={parts.port or 5432} dbname={parts.path.lstrip('/')} "
        f"user={parts.username or 'postgres'}"
        + (f" password={parts.password}" if parts.password else "")
    )
