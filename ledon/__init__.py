"""Internal pieces shared by the ``jobs``, ``outbox``, ``sagas`` and ``workflows`` apps.

Not a Django app and not a public API: nothing here imports a model or any of the
apps, and names may change between releases. Use the apps' own modules.

The engines:

- :mod:`ledon.engine` — the base of the long-running engines: stopping in escalating
  levels, signals that cannot deadlock, guarded database steps;
- :mod:`ledon.commands` — running an engine from its management command;
- :mod:`ledon.beside` — engines that run on a thread beside another (the scheduler);
- :mod:`ledon.burst` — engines that run side by side until none has anything left
  (``run_jobs --burst`` and the engines beside its worker);
- :mod:`ledon.backoff` — the back-off every engine uses after a database failure;
- :mod:`ledon.outage` — says an outage once, sums it up while it lasts, and says when
  it ends;
- :mod:`ledon.pglisten` — the PostgreSQL LISTEN thread that wakes an engine;
- :mod:`ledon.deadline` — the round-trip watchdog that turns a silent connection into
  an error, and the libpq options of the engines' connections;
- :mod:`ledon.faults` — named fault points for crash tests.

The database and the stores:

- :mod:`ledon.db` — the alias and vendor switch, datetime adapters, the caller-atomic
  check, connection reset, the start-up check (unreachable or not migrated);
- :mod:`ledon.values` — a stored row as its frozen value, the outcome of a fenced
  write, and the outcome of a scoped cancel;
- :mod:`ledon.clock` — the time a transition is recorded at, one rule for every store;
- :mod:`ledon.retention` — what the purge commands share: each app's growing tables
  deleted past their retention, in batches;
- :mod:`ledon.validation` — the one rule for a text field a caller hands to any app;
- :mod:`ledon.errors` — the errors' root, whose docstring is its default message,
  the stored error text, and signals sent so that a failing receiver never stops
  the sender.

The apps' set-up:

- :mod:`ledon.apps` — the base of the apps' configs;
- :mod:`ledon.conf` — reading the apps' settings dicts (unknown keys, 'did you mean')
  and the checks of their values;
- :mod:`ledon.naming` — how the registries name the functions they hold;
- :mod:`ledon.checks` — the system checks every app shares (SQLite's set-up);
- :mod:`ledon.lazy` — packages whose public names are imported on first use;
- :mod:`ledon.admin` — the read-only admin base and its guarded actions;
- :mod:`ledon.dashboard` — what an app adds to the admin's dashboard.

Watching them run (each optional layer is loaded only when its setting is on):

- :mod:`ledon.observability` — turning an app's metrics and tracing on or off;
- :mod:`ledon.registry` — the workers registry: one row per running engine;
- :mod:`ledon.metrics` — the metrics view a project routes, importable without the
  ``[metrics]`` extra; :mod:`ledon.prometheus` — the Prometheus metrics themselves
  (the ``[metrics]`` extra);
- :mod:`ledon.tracing` — the tracing hooks the apps call, :mod:`ledon.spans` their
  shapes, :mod:`ledon.otel` the OpenTelemetry tracer behind them (the ``[otel]``
  extra).
"""
