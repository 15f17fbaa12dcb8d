"""Watching the apps run: the workers registry's table and store, the reads behind the
database gauges and the admin's dashboard, the fields of the engines' log lines, and
the optional layers.

- :mod:`.worker_registry`, :mod:`.models` — the workers registry's store and table;
- :mod:`.reads`, :mod:`.charts`, :mod:`.admin` — the dashboard and its reads (also
  behind the database gauges);
- :mod:`.log_fields` — the structured fields of the jobs engines' log lines;
- :mod:`.metrics` (``[metrics]``: prometheus-client) and :mod:`.tracing` (through
  :mod:`ledon.tracing`, ``[otel]``: opentelemetry-api) — optional layers. No core
  module imports them: the app's :class:`~ledon.observability.OptionalLayers` does,
  when ``JOBS["METRICS"]`` or ``JOBS["TRACING"]`` asks for them (at start-up, and again
  when the setting changes).

**Why the registry's table lives in ``jobs``.** Every engine of the three apps keeps
a row (:mod:`ledon.registry`), but a table must belong to an app, ``ledon`` is none,
and ``jobs`` must work without ``outbox`` while ``outbox`` must not import ``jobs``.
``jobs`` is the app every deployment with workers has and the one whose admin holds
the dashboard, so the table is ``jobs_workerrecord``, and ``jobs`` installs its store
into :mod:`ledon.registry` from its ``ready()``. The outbox and saga engines reach it
only through that interface: with ``jobs`` installed they are recorded too, without
it they run unrecorded.
"""
