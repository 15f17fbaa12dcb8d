"""Every query behind the database gauges and the dashboard is answered by an
index at 1,000,000 finished rows per table (PostgreSQL's plans; how long a scrape takes
is measured by ``python -m benchmarks.observability``, never asserted here)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from benchmarks.observability import live_rows, load_history
from jobs.observability import reads
from outbox.observability import reads as outbox_reads
from sagas.observability import reads as sagas_reads

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.slow,
    pytest.mark.django_db,
    # Three million rows take a minute or two to load on a small machine.
    pytest.mark.timeout(900),
]

ROWS = 1_000_000
#: Each query and the index its plan must use.
EXPECTED = {
    "queued per queue": "jobs_job_line_idx",
    "running per queue": "jobs_job_current_token",
    "finished in the last hour": "jobs_job_finished_idx",
    "oldest waiting job": "jobs_job_line_idx",
    "outbox backlog": "outbox_msg_status_type_idx",
    "open saga instances": "sagas_instance_status",
    "sagas needing attention": "sagas_instance_status",
}


def test_every_gauge_and_dashboard_query_uses_an_index_at_a_million_rows():
    load_history(ROWS)
    live_rows()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM jobs_job WHERE finished_at IS NOT NULL")
        assert cursor.fetchone()[0] >= ROWS
        cursor.execute("ANALYZE")
    now = timezone.now()
    queries = [
        *reads.queries(now),
        *outbox_reads.queries(),
        *sagas_reads.queries(),
    ]
    assert sorted(name for name, _ in queries) == sorted(EXPECTED)
    for name, queryset in queries:
        plan = queryset.explain()
        assert "Seq Scan" not in plan, f"{name}:\n{plan}"
        assert EXPECTED[name] in plan, f"{name}:\n{plan}"
    # And the gauges, read as a scrape reads them, give the live rows' numbers.
    states = {s.queue: s for s in reads.queue_states(now)}
    assert sum(s.queued for s in states.values()) == 180
    assert sum(s.running for s in states.values()) == 20
    assert outbox_reads.backlog().pending == 200
