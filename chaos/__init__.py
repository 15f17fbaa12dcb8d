"""One recorded history across the four apps, under mixed faults, checked afterwards.

``python -m chaos`` (``make chaos``) starts a PostgreSQL cluster of its own and real
engine processes — ``run_jobs``, ``dispatch_outbox``, ``consume_events`` (through
RabbitMQ) and ``recover_sagas`` — each reaching the server through a loopback fault
proxy of its own (``tests/support/proxy.py``). A feeder process writes the workload
of ``testproject.history``: jobs, orders whose outbox messages a consumer handles
through the inbox and turns into signals, workflow runs with activities, a timer and
a signal, and sagas (some of which compensate). Every effect is recorded with its ids.

Meanwhile a seeded schedule of faults (:mod:`chaos.schedule`) is applied:
``SIGKILL`` and ``SIGTERM`` of engines, PostgreSQL crashes and restarts — one while a
worker runs its start-up recovery, one while a dispatcher recovers the batches it
held — partitions (the proxy drops every byte) and lost ``COMMIT`` replies.

Afterwards :mod:`chaos.checker` reads the recorded rows and proves, in plain Python,
that every effect that must happen once happened once, every at-least-once effect at
least once, nothing was lost, and every job, run and saga was final within a lease
plus 5 s after the last fault; it prints a verdict table and the run exits non-zero
on any violation.

This is a package of its own rather than a test module because it is a program: the
full run (100,000 jobs, 20,000 messages, 5,000 runs, 2,000 sagas) takes far longer
than any test may, writes a report, and is run by hand or by ``make chaos``. The
test suite runs its short profile (``tests/processes/test_chaos.py``).
"""
