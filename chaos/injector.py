"""Applying the faults of a schedule to a running fleet, and what each one did."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from .fleet import OUTAGE, Fleet, FleetError
from .schedule import Fault

#: How long a targeted fault waits for its moment (a worker holding jobs, a
#: dispatcher publishing a batch) before it goes on without it.
MOMENT = 60.0


@dataclass
class Applied:
    """A fault as it was applied: when it began and ended (``time.monotonic()``), and
    what it found (``note``)."""

    fault: Fault
    began: float
    ended: float
    note: str = ""


def pause(seconds: float) -> None:
    """The length of a fault (a partition, the server down): time is what it is made
    of, so here, and only here, the run waits on the clock."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


class Injector:
    def __init__(self, fleet: Fleet, work_dir: Path) -> None:
        self.fleet = fleet
        self.work_dir = work_dir
        self.applied: list[Applied] = []
        self._markers = 0

    def apply(self, fault: Fault) -> Applied:
        began = time.monotonic()
        note = getattr(self, "_" + fault.kind.name.lower())(fault) or ""
        applied = Applied(fault, began, time.monotonic(), note)
        self.applied.append(applied)
        return applied

    # ------------------------------------------------------------------ the kinds

    def _sigkill(self, fault: Fault) -> str:
        process = self.fleet.processes[fault.target]
        held = self._held(fault.target)
        process.kill()
        process.start()
        process.wait_started()
        return f"{held} held" if held is not None else ""

    def _sigterm(self, fault: Fault) -> str:
        process = self.fleet.processes[fault.target]
        code = process.terminate()
        process.start()
        process.wait_started()
        return f"exit status {code}"

    def _pg_restart(self, fault: Fault) -> str:
        self.fleet.cluster.crash()
        pause(fault.seconds)
        self.fleet.cluster.restart()
        return ""

    def _partition(self, fault: Fault) -> str:
        proxy = self.fleet.processes[fault.target].proxy
        proxy.black_hole()
        pause(fault.seconds)
        proxy.forward()
        return ""

    def _lost_commit(self, fault: Fault) -> str:
        assert fault.lost is not None
        proxy = self.fleet.processes[fault.target].proxy
        proxy.drop_reply(fault.lost.pattern, after=fault.lost.after)
        return "armed"

    def _pg_restart_in_worker_recovery(self, fault: Fault) -> str:
        """Kill a worker that holds attempts; start it again, and crash the server
        while its start-up recovery is about to re-queue them."""
        worker = self.fleet.processes[fault.target]
        held_query = "SELECT count(*) FROM jobs_job WHERE leased_by = %s AND status = 'running'"
        # Without jobs held the restart during recovery happens anyway, with less to do.
        with contextlib.suppress(FleetError):
            worker.wait_for(
                lambda: self.fleet.value(held_query, [fault.target]), "it to hold jobs", MOMENT
            )
        worker.kill()
        held = self.fleet.value(held_query, [fault.target])
        self._restart_server_at(worker.name, "jobs.worker.recovering")
        return f"{held} attempt(s) left running by the killed worker, re-queued at start-up"

    def _pg_restart_in_dispatcher_recovery(self, fault: Fault) -> str:
        """Start a dispatcher that dies right after publishing a batch (leased, not
        recorded); start it again, and crash the server while its start-up recovery is
        about to release that batch."""
        dispatcher = self.fleet.processes[fault.target]
        dispatcher.kill()
        dispatcher.start({"CHAOS_FAULT": "outbox.dispatcher.published@1:kill"})
        deadline = time.monotonic() + MOMENT
        while dispatcher.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if dispatcher.alive():
            dispatcher.kill()
        else:
            dispatcher.exits.append(("killed after publishing", dispatcher.current.proc.wait()))
        held = self.fleet.value(
            "SELECT count(*) FROM outbox_outboxmessage WHERE leased_by = %s AND status = 'pending'",
            [fault.target],
        )
        self._restart_server_at(dispatcher.name, "outbox.dispatcher.recovering")
        return f"{held} published message(s) left leased, released at start-up"

    def _restart_server_at(self, name: str, point: str) -> None:
        """Start process ``name`` paused at fault point ``point``; crash the server;
        let the process go on into the outage; start the server again; wait until the
        process is at work."""
        process = self.fleet.processes[name]
        self._markers += 1
        marker = self.work_dir / f"{name}-{self._markers}-at-point"
        release = self.work_dir / f"{name}-{self._markers}-release"
        process.start({"CHAOS_FAULT": f"{point}@1:pause:{marker}:{release}"})
        process.wait_for(marker.exists, f"{name} to reach {point}")
        self.fleet.cluster.crash()
        mark = len(process.output)
        release.touch()
        process.wait_for(lambda: OUTAGE in process.output[mark:], f"{name} to meet the outage")
        self.fleet.cluster.restart()
        process.wait_started()

    def _held(self, name: str) -> int | None:
        """Jobs a worker holds now (None for another engine)."""
        if self.fleet.processes[name].role != "worker":
            return None
        return int(
            self.fleet.value(
                "SELECT count(*) FROM jobs_job WHERE leased_by = %s AND status = 'running'",
                [name],
            )
        )
