"""The sizes of a chaos run: the full one (``make chaos``) and the short one CI runs."""

from __future__ import annotations

from dataclasses import dataclass

from testproject.history.workload import (
    JOBS_PER_UNIT,
    ORDERS_PER_UNIT,
    RUNS_PER_UNIT,
    SAGAS_PER_UNIT,
)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    #: Units of the workload (``testproject.history.workload``).
    units: int
    workers: int
    dispatchers: int
    saga_runners: int
    #: Handlers per worker.
    concurrency: int
    #: Jobs queued or running above which the feeder waits before its next unit.
    window: int
    #: How many faults of each kind the seeded schedule draws (the two restarts during
    #: recovery and the last fault are always there).
    kills: int
    terms: int
    restarts: int
    partitions: int
    lost_commits: int
    #: Lease of jobs, outbox batches and saga instances, in seconds.
    lease: float = 5.0
    #: The engines' round-trip deadline, in seconds.
    deadline: float = 2.0

    @property
    def counts(self) -> dict[str, int]:
        return {
            "jobs": self.units * JOBS_PER_UNIT,
            "messages": self.units * ORDERS_PER_UNIT,
            "workflow runs": self.units * RUNS_PER_UNIT,
            "sagas": self.units * SAGAS_PER_UNIT,
        }


FULL = Profile(
    name="full",
    units=1000,
    workers=3,
    dispatchers=2,
    saga_runners=2,
    concurrency=8,
    window=1500,
    kills=12,
    terms=8,
    restarts=6,
    partitions=8,
    lost_commits=24,
)

SHORT = Profile(
    name="short",
    units=20,
    workers=2,
    dispatchers=1,
    saga_runners=1,
    concurrency=4,
    window=300,
    kills=2,
    terms=1,
    restarts=1,
    partitions=1,
    lost_commits=4,
)

PROFILES = {p.name: p for p in (FULL, SHORT)}
