"""Watching the sagas app run.

- :mod:`.hooks` — what the app tells observers, without importing OpenTelemetry or
  prometheus-client: spans through :mod:`ledon.tracing` and the app's signals;
- :mod:`.reads` — the reads behind the database gauges and the admin's dashboard;
- :mod:`.metrics` — Prometheus metrics, an optional layer (``[metrics]``:
  prometheus-client). No core module imports it: the app's
  :class:`~ledon.observability.OptionalLayers` does, when ``SAGAS["METRICS"]`` asks
  for it (at start-up, and again when the setting changes).
"""
