"""The seeded schedule of faults: which fault, on which process, after which unit of
the workload.

The same seed gives the same schedule (the order, the targets, the durations); the
moments are tied to the feeder's progress (a fault is applied once the feeder's
unit ``at_unit`` was acknowledged), not to the clock, so that a busy machine slows a
run down without changing what it does. Every schedule has one PostgreSQL restart
while a worker runs its start-up recovery, one while a dispatcher recovers the batch
it held, and a last fault after the whole workload was acknowledged, from which the
time to final is counted.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from .profiles import Profile


class Kind(enum.StrEnum):
    SIGKILL = "SIGKILL"
    SIGTERM = "SIGTERM"
    PG_RESTART = "PostgreSQL restart"
    PG_RESTART_IN_WORKER_RECOVERY = "PostgreSQL restart during a worker's start-up recovery"
    PG_RESTART_IN_DISPATCHER_RECOVERY = (
        "PostgreSQL restart while a dispatcher recovers its leased batch"
    )
    PARTITION = "partition"
    LOST_COMMIT = "lost COMMIT reply"


@dataclass(frozen=True, slots=True)
class LostReply:
    """A write whose reply the proxy drops: the reply to the first statement that
    contains ``pattern`` (after ``after``, on the same connection, when given)."""

    what: str
    pattern: bytes
    after: bytes | None = None


#: The writes whose replies are dropped, by the role of the process that makes them.
LOST_REPLIES: dict[str, tuple[LostReply, ...]] = {
    "worker": (
        LostReply("a settle (finish and claim)", b"orphan"),
        LostReply("a heartbeat", b"RETURNING current_token AS token, cancel_requested"),
        LostReply("a workflow checkpoint", b"COMMIT", b'INSERT INTO "workflows_workflowstep"'),
        LostReply("the end of a map, timer or wait", b"COMMIT", b'UPDATE "workflows_workflowstep"'),
        LostReply("a job handler's effect", b"COMMIT", b'INSERT INTO "history_effect"'),
    ),
    "dispatcher": (LostReply("marking a batch sent", b"COMMIT", b"sent_at = "),),
    "consumer": (
        LostReply(
            "an inbox record with its effects and signal",
            b"COMMIT",
            b"(consumer, message_id, processed_at)",
        ),
    ),
    "saga runner": (LostReply("a saga step with its mark", b"COMMIT", b'"completed_steps"'),),
    "feeder": (
        LostReply("a submission", b"ON CONFLICT (scope_hash, job_id) DO NOTHING"),
        LostReply("an order with its message and run", b"COMMIT", b'INSERT INTO "history_order"'),
    ),
}


@dataclass(frozen=True, slots=True)
class Fault:
    kind: Kind
    #: The process it hits ("" for the database server).
    target: str
    #: Applied once the feeder acknowledged this many units (``units``: all of them).
    at_unit: int
    #: How long the fault lasts (a partition, the server down), in seconds.
    seconds: float = 0.0
    lost: LostReply | None = None

    def describe(self) -> str:
        where = f" of {self.target}" if self.target else ""
        if self.kind is Kind.PARTITION:
            return f"{self.kind}{where} for {self.seconds:.1f} s"
        if self.kind is Kind.PG_RESTART:
            return f"{self.kind} after {self.seconds:.1f} s down"
        if self.lost is not None:
            return f"{self.kind}{where}: {self.lost.what}"
        return f"{self.kind}{where}"


def build(profile: Profile, roles: dict[str, list[str]], seed: int) -> list[Fault]:
    """The schedule of ``profile`` over the processes named in ``roles`` (role ->
    process names), drawn from ``seed``."""
    rng = random.Random(seed)
    engines = [name for role, names in roles.items() if role != "feeder" for name in names]
    lease = profile.lease
    drawn: list[tuple[Kind, str, float, LostReply | None]] = []
    drawn += [(Kind.SIGKILL, rng.choice(engines), 0.0, None) for _ in range(profile.kills)]
    drawn += [(Kind.SIGTERM, rng.choice(engines), 0.0, None) for _ in range(profile.terms)]
    drawn += [
        (Kind.PG_RESTART, "", round(rng.uniform(0.2, 3.0), 1), None)
        for _ in range(profile.restarts)
    ]
    drawn += [
        (Kind.PARTITION, rng.choice(engines), round(rng.uniform(0.5, 2.5) * lease, 1), None)
        for _ in range(profile.partitions)
    ]
    writers = [(role, name) for role, names in roles.items() for name in names]
    for _ in range(profile.lost_commits):
        role, name = rng.choice(writers)
        drawn.append((Kind.LOST_COMMIT, name, 0.0, rng.choice(LOST_REPLIES[role])))
    drawn.append((Kind.PG_RESTART_IN_WORKER_RECOVERY, rng.choice(roles["worker"]), 0.0, None))
    drawn.append(
        (Kind.PG_RESTART_IN_DISPATCHER_RECOVERY, rng.choice(roles["dispatcher"]), 0.0, None)
    )
    rng.shuffle(drawn)
    # Spread over the feed, from its first tenth to its last: the engines are at work.
    positions = sorted(
        max(1, int(rng.uniform(0.1, 0.95) * profile.units)) for _ in range(len(drawn))
    )
    faults = [
        Fault(kind, target, at, seconds, lost)
        for (kind, target, seconds, lost), at in zip(drawn, positions, strict=True)
    ]
    # The last fault, once everything was acknowledged: time to final counts from it.
    last = rng.choice([Kind.SIGKILL, Kind.PG_RESTART, Kind.PARTITION])
    target = "" if last is Kind.PG_RESTART else rng.choice(roles["worker"])
    seconds = {Kind.SIGKILL: 0.0, Kind.PG_RESTART: 1.0, Kind.PARTITION: 1.5 * lease}[last]
    faults.append(Fault(last, target, profile.units, seconds))
    return faults
