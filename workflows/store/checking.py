"""Reading the runs in flight for an upgrade check: batches of runs (Waiting,
Running or Failed), each with its recorded checkpoints, in two queries a batch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..models import WorkflowRun
from ..types import DrivenRun, RunStatus
from .checkpoints import RecordedSteps, load_steps_of

#: The statuses of a run in flight: what a deploy of new code would replay.
IN_FLIGHT = (RunStatus.WAITING, RunStatus.RUNNING, RunStatus.FAILED)

_RUN_FIELDS = (
    "pk",
    "scope_hash",
    "run_id",
    "name",
    "version",
    "input_json",
    "generation",
    "advances",
    "rerun_keys",
    "parent_id",
    "parent_key",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunInFlight:
    """A run in flight as an upgrade check replays it: the run, where it stands, the
    checkpoint a Failed run failed at, and its recorded checkpoints by key."""

    run: DrivenRun
    status: RunStatus
    failed_step: str
    steps: RecordedSteps


def runs_in_flight(batch: int) -> Iterator[list[RunInFlight]]:
    """Every run in flight, oldest first, ``batch`` runs at a time."""
    after = 0
    while True:
        rows = list(
            WorkflowRun.objects.filter(status__in=IN_FLIGHT, pk__gt=after)
            .order_by("pk")
            .values_list(*_RUN_FIELDS, "status", "failed_step")[:batch]
        )
        if not rows:
            return
        after = rows[-1][0]
        steps = load_steps_of([row[0] for row in rows])
        runs = []
        for row in rows:
            fields = dict(zip(_RUN_FIELDS, row, strict=False))
            fields["rerun_keys"] = tuple(fields["rerun_keys"])
            runs.append(
                RunInFlight(
                    run=DrivenRun(**fields),
                    status=RunStatus(row[-2]),
                    failed_step=row[-1],
                    steps=steps.get(row[0]) or RecordedSteps(),
                )
            )
        yield runs
