"""A private throw-away PostgreSQL cluster for real-process fault tests
(``scripts/pg.sh``), with synchronous commits so that a crash loses nothing
acknowledged; :meth:`Cluster.crash` stops it at once (``-m immediate``) and
:meth:`Cluster.restart` starts it again on its port."""

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

    def __init__(self, *, synchronous_commit: bool = True) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="ledon-faults-pg-"))
        self.env = {**os.environ, "PG_SYNC_COMMIT": "on" if synchronous_commit else "off"}
        self.url = self._pg("start").stdout.strip().splitlines()[-1]
        self.port = urlsplit(self.url).port or 5432

    def _pg(self, command: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(PG), command, str(self.directory)],
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

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Every row of ``query``."""
        import psycopg

        with psycopg.connect(conninfo(self.url)) as conn:
            return conn.execute(query, params).fetchall()
