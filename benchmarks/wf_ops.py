"""``python -m benchmarks.wf_ops``: the operations on runs in flight, timed on a
throw-away PostgreSQL with durable commits (or ``--database-url``), in a scratch
database of its own:

- **the upgrade check:** ``manage.py check_workflows`` over ``runs`` runs in flight of
  ``checkpoints`` recorded inline checkpoints each, then a signal wait (the runs are
  written in bulk, as the engine would have recorded them);
- **a fork:** ``WorkflowScope.fork`` of a run of ``fork_checkpoints`` recorded
  checkpoints from its last one (every checkpoint before it copied).

Prints the median of ``--runs`` rounds of each (one process, this one) and writes the
raw JSON to ``benchmarks/results/wf-ops-<time>.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .server import DATABASE_URL_HELP, django_on, scratch_database, server, server_settings
from .systems.base import ROOT

SCOPE = "bench"
SETTINGS = "benchmarks.wf_settings"
#: Rows per bulk insert of the seeded runs and checkpoints.
SEED_BATCH = 5000


def seed(prefix: str, runs: int, checkpoints: int) -> None:
    """``runs`` runs of ``wfbench.replay`` waiting for their signal after
    ``checkpoints`` recorded inline steps, written in bulk."""
    from django.db import transaction
    from django.utils import timezone

    from workflows import validation
    from workflows.models import WorkflowRun, WorkflowStep
    from workflows.types import RunStatus, StepKind, StepStatus, WaitKind

    now = timezone.now()
    scope_hash = validation.scope_hash(SCOPE)
    input_json = json.dumps({"steps": checkpoints})
    with transaction.atomic():
        created = WorkflowRun.objects.bulk_create(
            [
                WorkflowRun(
                    scope_hash=scope_hash,
                    run_id=f"{prefix}-{index}",
                    name="wfbench.replay",
                    version=1,
                    input_json=input_json,
                    status=RunStatus.WAITING,
                    wait_kind=WaitKind.SIGNAL,
                    wait_key="go",
                    created_at=now,
                    updated_at=now,
                )
                for index in range(runs)
            ],
            batch_size=SEED_BATCH,
        )
        steps: list[WorkflowStep] = []
        for run in created:
            for index in range(checkpoints):
                steps.append(
                    WorkflowStep(
                        run_id=run.pk,
                        key=f"s{index}",
                        kind=StepKind.STEP,
                        status=StepStatus.SUCCEEDED,
                        attempts=1,
                        result_json=str(index),
                        started_at=now,
                        finished_at=now,
                    )
                )
            steps.append(
                WorkflowStep(
                    run_id=run.pk,
                    key="go",
                    kind=StepKind.SIGNAL,
                    status=StepStatus.WAITING,
                    started_at=now,
                )
            )
            if len(steps) >= SEED_BATCH:
                WorkflowStep.objects.bulk_create(steps, batch_size=SEED_BATCH)
                steps = []
        WorkflowStep.objects.bulk_create(steps, batch_size=SEED_BATCH)


def time_check(runs: int, checkpoints: int) -> float:
    """Seconds of one ``manage.py check_workflows`` over the seeded runs (all clean)."""
    from django.core.management import call_command

    out = io.StringIO()
    started = time.perf_counter()
    call_command("check_workflows", stdout=out)
    took = time.perf_counter() - started
    expected = f"wfbench.replay v1: {runs} of {runs} run(s) in flight replay cleanly"
    assert expected in out.getvalue(), out.getvalue()
    return took


def time_fork(checkpoints: int, round_: int) -> float:
    """Seconds of one ``WorkflowScope.fork`` of the seeded run of ``checkpoints``
    checkpoints from its signal wait (every checkpoint before it copied)."""
    from workflows import WorkflowScope

    started = time.perf_counter()
    forked = WorkflowScope(SCOPE).fork("long-0", f"long-fork-{round_}", from_step="go")
    took = time.perf_counter() - started
    assert len(forked.steps) == checkpoints, len(forked.steps)
    return took


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.wf_ops", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--runs", type=int, default=3, help="rounds (the median is kept)")
    parser.add_argument("--database-url", help=DATABASE_URL_HELP)
    parser.add_argument("--check-runs", type=int, help="runs in flight (default 10000)")
    parser.add_argument("--checkpoints", type=int, default=20, help="checkpoints per run")
    parser.add_argument("--fork-checkpoints", type=int, help="checkpoints of the forked run")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.runs
    sizes = {
        "check_runs": args.check_runs or (100 if args.quick else 10_000),
        "checkpoints": args.checkpoints,
        "fork_checkpoints": args.fork_checkpoints or (100 if args.quick else 10_000),
    }
    with ExitStack() as stack:
        server_url = stack.enter_context(server(args.database_url))
        raw: dict[str, Any] = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "sizes": sizes,
            "runs": rounds,
            "server": server_settings(server_url),
        }
        url = stack.enter_context(scratch_database(server_url, "ledon_wf_ops_bench"))
        django_on(url, stack, SETTINGS)
        seed("check", sizes["check_runs"], sizes["checkpoints"])
        raw["check_seconds"] = [
            time_check(sizes["check_runs"], sizes["checkpoints"]) for _ in range(rounds)
        ]
        seed("long", 1, sizes["fork_checkpoints"])
        raw["fork_seconds"] = [
            time_fork(sizes["fork_checkpoints"], round_) for round_ in range(rounds)
        ]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"wf-ops-{raw['when'].replace(':', '')}.json"
    path.write_text(json.dumps(raw, indent=2))
    print(
        f"check_workflows: {sizes['check_runs']} runs of {sizes['checkpoints']} checkpoints "
        f"in {statistics.median(raw['check_seconds']):.2f} s (median of {rounds})"
    )
    print(
        f"fork: a run of {sizes['fork_checkpoints']} checkpoints in "
        f"{statistics.median(raw['fork_seconds']) * 1000:.0f} ms (median of {rounds})"
    )
    print(f"raw results: {path}")


if __name__ == "__main__":
    main()
