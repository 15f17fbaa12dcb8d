"""A private throw-away PostgreSQL cluster for real-process fault tests
(``scripts/pg.sh``), with synchronous commits so that a crash loses nothing
acknowledged; :meth:`Cluster.crash` stops it at once (``-m immediate``) and
:meth:`Cluster.restart` starts it again on its port. :meth:`Cluster.standby` adds a
streaming standby of it (``pg_basebackup``), a cluster of its own that
:meth:`Cluster.promote` turns into a primary."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[2]
PG = ROOT / "scripts" / "pg.sh"


def conninfo(url: str) -> str:
    """libpq's key=value form of a postgres:// URL."""
    parts = urlsplit(url)
    return (
        f"host={parts.hostname} port={parts.port or 5432} dbname={parts.path.lstrip('/')} "
        f"user={parts.username or 'postgres'}"
        + (f" password={parts.password}" if parts.password else "")
    )


class Cluster:
    """A cluster of its own in a temporary directory; :meth:`stop` removes it."""

    def __init__(
        self,
        *,
        synchronous_commit: bool | str = True,
        primary: Cluster | None = None,
        through: int | None = None,
    ) -> None:
        """``synchronous_commit``: the server's setting (True "on", False "off", or a
        value such as "remote_apply"); ``primary``: start as a standby of it,
        reaching it at port ``through`` if given."""
        self.directory = Path(tempfile.mkdtemp(prefix="ledon-faults-pg-"))
        setting = {True: "on", False: "off"}.get(synchronous_commit, synchronous_commit)
        self.env = {**os.environ, "PG_SYNC_COMMIT": str(setting)}
        if through is not None:
            self.env["PG_PRIMARY_PORT"] = str(through)
        if primary is None:
            started = self._pg("start")
        else:
            started = self._pg("standby", str(primary.directory), str(self.directory))
        self.url = started.stdout.strip().splitlines()[-1]
        self.port = urlsplit(self.url).port or 5432

    def _pg(self, command: str, *args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(PG), command, *(args or [str(self.directory)])],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, f"pg.sh {command}:\n{result.stderr}"
        return result

    def crash(self) -> None:
        """Stop the server at once, as a crash would (``pg_ctl -m immediate``)."""
        self._pg("crash")

    def restart(self) -> None:
        """Start the crashed or stopped server again, on its port."""
        self._pg("restart")

    def standby(self, *, through: int | None = None) -> Cluster:
        """A streaming standby of this server, started on a port of its own; it
        reaches this server at port ``through`` (a proxy) when given."""
        return Cluster(synchronous_commit=self.env["PG_SYNC_COMMIT"], primary=self, through=through)

    def promote(self) -> None:
        """Make this standby a primary (returns once it accepts writes)."""
        self._pg("promote")

    def restart_elsewhere(self) -> None:
        """Start the stopped server again on another port: alone, out of reach of
        whatever still names the old one (a failed-over primary, read afterwards)."""
        import socket

        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            self.port = free.getsockname()[1]
        (self.directory / "port").write_text(f"{self.port}\n")
        self.url = self.url.rsplit(":", 1)[0] + f":{self.port}/" + self.url.rsplit("/", 1)[1]
        self._pg("restart")

    def stop(self) -> None:
        self._pg("stop")
        shutil.rmtree(self.directory, ignore_errors=True)

    def value(self, query: str, params: Any = None) -> Any:
        """The first column of the first row of ``query``."""
        import psycopg

        with psycopg.connect(conninfo(self.url)) as conn:
            row = conn.execute(query, params).fetchone()
        assert row is not None
        return row[0]

    def execute(self, statement: str) -> None:
        """Run ``statement`` outside a transaction (``ALTER SYSTEM``, ``CREATE DATABASE``)."""
        import psycopg

        with psycopg.connect(conninfo(self.url), autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[arg-type]

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Every row of ``query``."""
        import psycopg

        with psycopg.connect(conninfo(self.url)) as conn:
            return conn.execute(query, params).fetchall()
