"""Watching the apps run: the workers registry's table and store, the reads
behind the database gauges and the admin's dashboard.

**Why the registry's table lives in ``jobs``.** Every engine of the three apps keeps
a row (:mod:`ledon.registry`), but a table must belong to an app, ``ledon`` is none,
and ``jobs`` must work without ``outbox`` while ``outbox`` must not import ``jobs``.
``jobs`` is the app every deployment with workers has and the one whose admin holds
the dashboard, so the table is ``jobs_workerrecord``, and ``jobs`` installs its store
into :mod:`ledon.registry` from its ``ready()``. The outbox and saga engines reach it
only through that interface: with ``jobs`` installed they are recorded too, without
it they run unrecorded.
"""
