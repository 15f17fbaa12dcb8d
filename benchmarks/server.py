"""The PostgreSQL server the benchmarks run against.

By default a throw-away cluster started with ``scripts/pg.sh`` and *durable* commits
(``fsync=on``, ``synchronous_commit=on``), as in production; it is always stopped at
the end. With an existing server (``--database-url``), a fresh database is created
on it for the run and dropped afterwards.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from urllib.parse import urlsplit, urlunsplit

from .systems.base import ROOT

#: Server options of the throw-away cluster beyond durability.
EXTRA_OPTIONS = (
    "-c shared_preload_libraries=pg_stat_statements -c track_wal_io_timing=on"
    " -c track_io_timing=on -c pg_stat_statements.track_utility=on"
)


@contextmanager
def throwaway_server() -> Iterator[str]:
    """Start a cluster with fsync on; yield its URL; stop and delete it.

    The server loads ``pg_stat_statements`` (statements per job) and times WAL writes
    and syncs (``track_wal_io_timing``: the commit's share of a job's time)."""
    directory = tempfile.mkdtemp(prefix="ledon-bench-pg.")
    env = {
        **os.environ,
        "PG_FSYNC": "on",
        "PG_SYNC_COMMIT": "on",
        "PG_EXTRA_OPTS": EXTRA_OPTIONS,
    }
    script = str(ROOT / "scripts" / "pg.sh")
    try:
        url = subprocess.run(
            [script, "start", directory], env=env, check=True, capture_output=True, text=True
        ).stdout.strip()
        yield url
    finally:
        subprocess.run([script, "stop", directory], check=False, capture_output=True)


def server(url: str | None) -> AbstractContextManager[str]:
    """The server ``url`` names, or without one a throw-away server for the block."""
    return nullcontext(url) if url else throwaway_server()


@contextmanager
def database(url: str | None, name: str) -> Iterator[tuple[str, str]]:
    """A scratch database ``name`` on the server ``url`` names, or without one on a
    throw-away server, for the block: the server's URL and the database's."""
    with server(url) as server_url, scratch_database(server_url, name) as database_url:
        yield server_url, database_url


#: The help of every entry point's ``--database-url``.
DATABASE_URL_HELP = (
    "use this PostgreSQL server (a scratch database is created and dropped) instead of "
    "starting a throw-away one with fsync on"
)


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextmanager
def scratch_database(server_url: str, name: str) -> Iterator[str]:
    """Create database ``name`` on the server of ``server_url``; drop it at the end.

    The name gets this process's id, so two runs on one server (tests side by side)
    never drop each other's database."""
    import psycopg

    name = f"{name}_{os.getpid()}"

    def admin(sql: str) -> None:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql)

    admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(server_url, name)
    finally:
        admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def django_on(
    url: str, stack: ExitStack, settings: str = "benchmarks.settings"
) -> Callable[[str], None]:
    """Point Django (the ``settings`` module) at ``url``, migrate, close its
    connections when ``stack`` closes; returns an ``admin(sql)`` runner."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = settings
    import django
    from django.core.management import call_command
    from django.db import connections

    django.setup()
    call_command("migrate", verbosity=0)
    stack.callback(connections.close_all)

    def admin(sql: str) -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute(sql)

    return admin


def server_settings(url: str) -> dict[str, str]:
    """The settings that shape the numbers, as the server reports them."""
    import psycopg

    names = (
        "server_version",
        "fsync",
        "synchronous_commit",
        "full_page_writes",
        "shared_buffers",
        "shared_preload_libraries",
    )
    with psycopg.connect(url, autocommit=True) as conn:
        return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]
