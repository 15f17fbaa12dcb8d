"""System checks every app registers (the check framework runs each function once).

``ledon.W001``: a file SQLite database without the options that let several
processes (workers, dispatchers, web requests) write to it. ``ledon.E001``: a
``LEDON_METRICS_TOKEN`` that is not a string. ``ledon.E002``: ``LEDON_ROUND_TRIP_DEADLINE``
is neither a positive number nor None.

Every check of the apps carries the tag :data:`ENGINES` (their database checks
excepted): the engines' commands run those checks alone before they start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import metrics_token, settings_reference
from .deadline import configured_deadline

#: What removes "database is locked" between processes: writers queue for the lock
#: at BEGIN instead of failing when they upgrade a read (IMMEDIATE), readers do not
#: block the writer (WAL), and a writer waits for the lock instead of failing.
RECOMMENDED_SQLITE_OPTIONS: dict[str, Any] = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL;",
}

#: The tag of the system checks an engine's command (``run_jobs``, ``dispatch_outbox``,
#: ``consume_events``, ``recover_sagas``) runs before it starts: the apps' own checks
#: and the tasks framework's. The rest of the project's checks (the admin's, the URLs',
#: the templates', the models') concern the web side and ``manage.py check``; a
#: project's own check that a worker needs is registered with this tag too
#: (``@checks.register("engines")``).
ENGINES = "engines"

_WAL = re.compile(r"journal_mode\s*=\s*wal\b", re.IGNORECASE)


def _in_memory(name: object) -> bool:
    text = str(name or "")
    return text in ("", ":memory:") or "mode=memory" in text


def _lacking(options: dict[str, Any]) -> list[str]:
    lacking = []
    if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
        lacking.append("transaction_mode IMMEDIATE")
    if not _WAL.search(str(options.get("init_command", ""))):
        lacking.append("WAL (PRAGMA journal_mode=WAL)")
    if "timeout" not in options:
        lacking.append("a busy timeout")
    return lacking


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _recommended(options: dict[str, Any]) -> dict[str, Any]:
    merged = {**options, **RECOMMENDED_SQLITE_OPTIONS}
    command = str(options.get("init_command", "")).strip()
    if command and not _WAL.search(command):
        merged["init_command"] = f"{RECOMMENDED_SQLITE_OPTIONS['init_command']} {command}"
    elif command:
        merged["init_command"] = command
    if "timeout" in options:
        merged["timeout"] = options["timeout"]
    return merged


def check_sqlite_options(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``ledon.W001`` for each SQLite database file configured without them."""
    return sqlite_warnings(settings.DATABASES)


def sqlite_warnings(databases: Mapping[str, Mapping[str, Any]]) -> list[checks.CheckMessage]:
    """The ``ledon.W001`` warnings for these ``DATABASES``."""
    messages: list[checks.CheckMessage] = []
    for alias, config in databases.items():
        if not str(config.get("ENGINE", "")).endswith("sqlite3") or _in_memory(config.get("NAME")):
            continue
        options = dict(config.get("OPTIONS") or {})
        lacking = _lacking(options)
        if not lacking:
            continue
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} is configured without {_and(lacking)}: "
                "workers and web requests writing at the same time will fail with "
                "'database is locked'",
                hint=f"In settings.py, set DATABASES[{alias!r}]['OPTIONS'] = "
                f"{_recommended(options)!r}",
                id="ledon.W001",
            )
        )
    return messages


def _setting_error(read: Callable[[], object], *, hint: str, id: str) -> list[checks.CheckMessage]:
    """The error ``id`` if reading a setting with ``read`` refuses its value."""
    try:
        read()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), hint=hint, id=id)]
    return []


def check_metrics_token(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``ledon.E001``: ``LEDON_METRICS_TOKEN`` is a string or None."""
    return _setting_error(
        metrics_token,
        hint="Read it from the environment: LEDON_METRICS_TOKEN = "
        "os.environ.get('LEDON_METRICS_TOKEN'). See " + settings_reference("LEDON_METRICS_TOKEN"),
        id="ledon.E001",
    )


def check_round_trip_deadline(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``ledon.E002`` if ``LEDON_ROUND_TRIP_DEADLINE`` is not a positive number or None."""
    return _setting_error(
        configured_deadline,
        hint="Seconds a database round trip of an engine may wait before its "
        "watchdog asks the server about it (default 10); None turns it off.",
        id="ledon.E002",
    )
