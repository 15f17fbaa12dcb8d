"""One chaos run: the fleet, the feed, the faults, the wait for final, the checker."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.cluster import conninfo

from . import checker, report
from .fleet import Fleet, FleetError, Process, acknowledged, rabbitmq_env
from .injector import Injector
from .profiles import Profile
from .schedule import Fault, Kind, build

#: The longest a run waits for its work to end after the last fault.
FINAL_TIMEOUT = 900.0


@dataclass
class Outcome:
    verdicts: list[checker.Verdict]
    conditions: dict[str, Any]
    faults: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def render(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        return "\n\n".join(
            [
                f"## Chaos run: {verdict}",
                report.conditions(self.conditions),
                report.verdicts(self.verdicts),
            ]
        )

    def as_json(self) -> str:
        return json.dumps(
            {
                "ok": self.ok,
                "conditions": self.conditions,
                "faults": self.faults,
                "verdicts": [v.__dict__ for v in self.verdicts],
            },
            indent=2,
            default=str,
        )


def write_gate(gate: Path, unit: int) -> None:
    """Let the feeder write the units below ``unit`` (written whole: it reads it)."""
    staged = gate.with_suffix(".new")
    staged.write_text(str(unit))
    staged.replace(gate)


class Run:
    def __init__(
        self,
        profile: Profile,
        *,
        seed: int,
        work_dir: Path,
        rabbitmq_url: str | None,
        say: Callable[[str], None] = print,
        final_timeout: float = FINAL_TIMEOUT,
    ) -> None:
        self.profile = profile
        self.final_timeout = final_timeout
        self.seed = seed
        self.work_dir = work_dir
        self.say = say
        transport = rabbitmq_env(rabbitmq_url) if rabbitmq_url else {
            "OUTBOX_TRANSPORT": "in-process"
        }  # fmt: skip
        self.fleet = Fleet(profile, work_dir, transport)
        self.crashed: list[str] = []
        self.started = time.monotonic()

    def elapsed(self) -> str:
        return f"{time.monotonic() - self.started:6.1f} s"

    def run(self) -> Outcome:
        try:
            return self._run()
        finally:
            self.fleet.close()

    def _run(self) -> Outcome:
        p, fleet = self.profile, self.fleet
        fleet.migrate()
        fleet.build()
        gate = self.work_dir / "gate"
        feeder = fleet.add(
            "feed", "feeder", "chaos_feed", "--units", str(p.units), "--window", str(p.window),
            "--gate", str(gate),
        )  # fmt: skip
        schedule = build(p, fleet.roles(), self.seed)
        self.say(f"chaos: profile {p.name}, seed {self.seed}, {len(schedule)} faults; logs in "
                 f"{self.work_dir}")  # fmt: skip
        fleet.start_engines()
        self.started = time.monotonic()
        feeder.start()
        injector = Injector(fleet, self.work_dir)
        disarmed = self._apply(schedule, injector, feeder, gate)
        last_fault = injector.applied[-1].ended
        final_at = self._wait_for_final(feeder)
        time_to_final = None if final_at is None else final_at - last_fault
        if final_at is None:
            self._describe_leftovers(feeder)
        self.say(f"chaos: [{self.elapsed()}] final {time_to_final and round(time_to_final, 1)} s "
                 "after the last fault; stopping the engines")  # fmt: skip
        for proc in fleet.engines():
            proc.terminate()
        terms = [
            (proc.name, code) for proc in fleet.engines() for how, code in proc.exits
            if how == "SIGTERM"
        ]  # fmt: skip
        verdicts = checker.check(
            checker.read(conninfo(fleet.cluster.url)),
            p.units,
            time_to_final=time_to_final,
            bound=p.lease + 5,
            terms=terms,
            crashed=self.crashed,
        )
        self._diagnose(verdicts)
        kinds = Counter(a.fault.kind for a in injector.applied)
        conditions = {
            "profile": f"{p.name} (seed {self.seed})",
            "workload": ", ".join(f"{n:,} {what}" for what, n in p.counts.items()),
            "engines": self._engines(),
            "consumer": (
                "consume_events through RabbitMQ"
                if fleet.broker
                else "in-process subscribers of the dispatchers (no broker)"
            ),
            "leases, round-trip deadline": f"{p.lease:g} s, {p.deadline:g} s",
            "faults": ", ".join(f"{n} {kind}" for kind, n in kinds.items()),
            "COMMIT replies lost": (
                f"{fleet.dropped_replies()} of {kinds[Kind.LOST_COMMIT]} armed"
                f" ({disarmed} not reached by the last fault)"
            ),
            "duration": f"{last_fault - self.started:.0f} s to the last fault",
            "time to final after the last fault": (
                "never" if time_to_final is None else f"{time_to_final:.1f} s"
            ),
        }
        return Outcome(verdicts, conditions, [self._fault_row(a) for a in injector.applied])

    def _apply(self, schedule: list[Fault], injector: Injector, feeder: Process, gate: Path) -> int:
        """Apply the schedule as the feed goes; how many armed lost replies the last
        fault found not reached (they are disarmed: the last fault is the last)."""
        disarmed = 0
        for index, fault in enumerate(schedule):
            # The feed goes on during this fault, up to where the next one waits.
            ahead = schedule[index + 1].at_unit if index + 1 < len(schedule) else self.profile.units
            write_gate(gate, max(ahead, fault.at_unit))
            self._wait_for_unit(feeder, fault.at_unit)
            if fault is schedule[-1]:
                # The last fault hits the tail of the work, while the last jobs run.
                self._wait_for_tail()
                disarmed = sum(proc.proxy.disarm() for proc in self.fleet.processes.values())
            applied = injector.apply(fault)
            self.say(
                f"chaos: [{self.elapsed()}, unit {acknowledged(feeder)}/{self.profile.units}] "
                f"{fault.describe()} ({applied.ended - applied.began:.1f} s) {applied.note}"
            )
        return disarmed

    def _diagnose(self, verdicts: list[checker.Verdict]) -> None:
        """Describe the runs that did not succeed (:func:`checker.diagnose`)."""
        stuck = sorted(
            {run for v in verdicts if v.check.startswith("workflow runs") for run in v.offenders}
        )
        if not stuck:
            return
        diagnosis = checker.diagnose(conninfo(self.fleet.cluster.url), stuck)
        (self.work_dir / "diagnosis.txt").write_text(diagnosis + "\n")
        self.say(f"chaos: runs that did not succeed:\n{diagnosis}")

    def _describe_leftovers(self, feeder: Process) -> None:
        """Say what was not final when the wait gave up, and whether the feeder
        still ran (:func:`checker.leftovers`); kept in ``leftovers.txt``."""
        try:
            described = checker.leftovers(conninfo(self.fleet.cluster.url))
        except Exception as exc:  # the server itself may be what is stuck
            described = f"the database could not be read: {exc!r}"
        if feeder.alive():
            described += f"\nthe feeder still runs; its output (end):\n{feeder.output[-2000:]}"
        (self.work_dir / "leftovers.txt").write_text(described + "\n")
        self.say(f"chaos: not final after {self.final_timeout:g} s:\n{described}")

    # ------------------------------------------------------------------ waiting

    def _watch(self) -> None:
        """Restart an engine that ended although no fault ended it; count it."""
        for proc in self.fleet.engines():
            if not proc.alive():
                self.crashed.append(f"{proc.name} ({proc.current.proc.poll()})")
                self.say(f"chaos: {proc.name} ended on its own:\n{proc.output[-3000:]}")
                proc.start()

    def _wait_for_unit(self, feeder: Process, unit: int) -> None:
        while acknowledged(feeder) < unit:
            if not feeder.alive() and acknowledged(feeder) < unit:
                raise FleetError("the feeder ended before its work was done", feeder)
            self._watch()
            time.sleep(0.1)

    def _wait_for_tail(self) -> None:
        """Until no more jobs are queued or running than the workers' slots, twice."""
        tail = 2 * self.profile.workers * self.profile.concurrency
        query = checker.UNFINISHED["jobs"]
        while int(self.fleet.value(query)) > tail:
            self._watch()
            time.sleep(0.1)

    def _wait_for_final(self, feeder: Process) -> float | None:
        """When nothing was left to do (``time.monotonic()``), or None."""
        deadline = time.monotonic() + self.final_timeout
        query = " UNION ALL ".join(f"({sql})" for sql in checker.UNFINISHED.values())
        while time.monotonic() < deadline:
            self._watch()
            try:
                left = sum(row[0] for row in self.fleet.cluster.rows(query))
            except Exception:  # the server may still be starting again
                left = -1
            if left == 0 and not feeder.alive():
                return time.monotonic()
            time.sleep(0.1)
        return None

    # ------------------------------------------------------------------ describing

    def _engines(self) -> str:
        roles = self.fleet.roles()
        roles.pop("feeder", None)
        return ", ".join(f"{len(names)} {role}(s)" for role, names in roles.items()) + (
            f"; {self.profile.concurrency} handlers per worker"
        )

    def _fault_row(self, applied: Any) -> dict[str, Any]:
        fault: Fault = applied.fault
        return {
            "kind": str(fault.kind),
            "target": fault.target,
            "at_unit": fault.at_unit,
            "at_s": round(applied.began - self.started, 1),
            "took_s": round(applied.ended - applied.began, 1),
            "what": fault.describe(),
            "note": applied.note,
        }
