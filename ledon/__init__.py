"""Internal pieces shared by the ``jobs``, ``outbox`` and ``sagas`` apps.

Not a Django app and not a public API: nothing here imports a model or any of the
three apps, and names may change between releases. Use the apps' own modules.

- :mod:`ledon.backoff` — the back-off every engine uses after a database failure;
- :mod:`ledon.outage` — says an outage once, sums it up while it lasts, and says when
  it ends;
- :mod:`ledon.db` — the alias and vendor switch, datetime adapters, the caller-atomic
  check, connection reset, the start-up check (unreachable or not migrated);
- :mod:`ledon.engine` — the base of the long-running engines: stopping in escalating
  levels, signals that cannot deadlock, guarded database steps;
- :mod:`ledon.commands` — running an engine from its management command;
- :mod:`ledon.pglisten` — the PostgreSQL LISTEN thread that wakes an engine;
- :mod:`ledon.deadline` — the round-trip watchdog that turns a silent connection into
  an error, and the libpq options of the engines' connections;
- :mod:`ledon.admin` — the read-only admin base and its guarded actions;
- :mod:`ledon.faults` — named fault points for crash tests;
- :mod:`ledon.errors` — the errors' root, whose docstring is its default message;
- :mod:`ledon.conf` — reading the apps' settings dicts (unknown keys, 'did you mean');
- :mod:`ledon.checks` — the system checks every app shares (SQLite's set-up).
"""
