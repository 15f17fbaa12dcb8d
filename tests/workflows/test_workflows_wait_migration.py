"""The migration that stores a run's wait as data reads the runs in flight from their
old display text once (and writes the text back if it is reversed)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("workflows", "0002_run_rerun_keys")]
AFTER = [("workflows", "0003_run_wait_as_data")]
UNTIL = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)

#: (old text, run status, its waiting checkpoint (kind, key, status) or None,
#: expected (wait_kind, wait_key)).
RUNS = [
    ("start", "waiting", None, ("start", "")),
    ("resume", "waiting", None, ("resume", "")),
    ("a new advance (the last one failed)", "waiting", None, ("advance", "")),
    ("signal approved", "waiting", ("signal", "approved", "waiting"), ("signal", "approved")),
    ("signal a b: c", "waiting", None, ("signal", "a b: c")),
    ("child ship/7", "waiting", ("child", "ship/7", "waiting"), ("child", "ship/7")),
    (f"timer until {UNTIL.isoformat()}", "waiting", ("sleep", "nap", "waiting"), ("timer", "nap")),
    (
        f"retry of reserve at {UNTIL.isoformat()}",
        "waiting",
        ("step", "reserve", "waiting"),
        ("retry", "reserve"),
    ),
    ("3 of 5 items", "waiting", ("map", "price", "running"), ("items", "price")),
    ("0 of 1 items", "running", ("activity", "charge", "running"), ("items", "charge")),
    ("", "succeeded", None, ("", "")),
]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.fixture
def old_schema():
    apps = migrate(BEFORE)
    yield apps
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def test_runs_in_flight_keep_what_they_wait_for_across_the_migration(old_schema):
    run_model = old_schema.get_model("workflows", "WorkflowRun")
    step_model = old_schema.get_model("workflows", "WorkflowStep")
    item_model = old_schema.get_model("workflows", "WorkflowItem")
    for number, (text, status, waiting, _expected) in enumerate(RUNS):
        run = run_model.objects.create(
            scope_hash="a" * 64,
            run_id=f"r{number}",
            name="n",
            version=1,
            input_json="null",
            status=status,
            waiting_for=text,
            wake_at=UNTIL if "until" in text or " at " in text else None,
            created_at=UNTIL,
            updated_at=UNTIL,
        )
        if waiting is not None:
            kind, key, step_status = waiting
            step_model.objects.create(
                run=run, key="done", kind="now", status="succeeded", started_at=UNTIL
            )
            step = step_model.objects.create(
                run=run,
                key=key,
                kind=kind,
                status=step_status,
                started_at=UNTIL,
                item_count=5 if kind == "map" else 1,
            )
            for index in range(step.item_count if kind in ("map", "activity") else 0):
                item_model.objects.create(
                    step=step,
                    index=index,
                    status="succeeded" if index < 3 and kind == "map" else "running",
                    args_json="[]",
                    job_id=f"j{number}-{index}",
                )

    after = migrate(AFTER).get_model("workflows", "WorkflowRun")
    found = {
        run_id: (kind, key)
        for run_id, kind, key in after.objects.values_list("run_id", "wait_kind", "wait_key")
    }
    assert found == {f"r{number}": expected for number, (*_, expected) in enumerate(RUNS)}

    before = migrate(BEFORE).get_model("workflows", "WorkflowRun")
    texts = dict(before.objects.values_list("run_id", "waiting_for"))
    assert texts == {f"r{number}": text for number, (text, *_) in enumerate(RUNS)}
