"""The workflows beside the jobs soak (``python -m benchmarks.soak --workflows RATE``).

Runs of ``wfbench.soak`` (``benchmarks/wfapp``) start at ``RATE`` per second, open
loop like the jobs: each sleeps (a timer), then waits for a signal that the harness
sends a few seconds after the run started; an inline step after each wait reports
over UDP when its advance ran it (:mod:`benchmarks.probe`). The **advance latency**
is from the moment the advance became due — the timer's ``wake_at``, the signal's
commit — to that report. The soak's held transaction pins the vacuum horizon for the
middle third of the run; the verdicts compare the advances due while it was held,
and in the minute after, with those due before it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .harness import percentile

SCOPE = "bench-soak"
WORKFLOW = "wfbench.soak"
#: The probe markers of the runs' reports start here (the jobs' count from 0): run n
#: reports ``FIRST + 2n`` after its timer and ``FIRST + 2n + 1`` after its signal.
FIRST = 100_000_000
#: The most p99 may grow while the horizon is pinned, against before.
PINNED_FACTOR = 3.0
#: "Back": p99 within this factor of before, in the first minute after the pin.
BACK_FACTOR = 1.5


@dataclass
class WorkflowArrivals:
    """Starts runs at ``rate`` per second and sends each its signal ``signal_after``
    seconds after its start (``tick`` from the soak's loop)."""

    rate: float
    sleep: float = 2.0
    signal_after: float = 5.0
    started: dict[int, float] = field(default_factory=dict)
    signalled: dict[int, float] = field(default_factory=dict)
    _start: float = 0.0

    def begin(self, start: float) -> None:
        self._start = start

    def tick(self, now: float, *, arriving: bool = True) -> None:
        """Start the runs due by ``now`` (while ``arriving``) and signal those due."""
        from workflows import send_signal, start_workflow

        while arriving and self._start + len(self.started) / self.rate <= now:
            n = len(self.started)
            start_workflow(
                SCOPE, f"soak-{n}", WORKFLOW, {"sleep": self.sleep, "marker": FIRST + 2 * n}
            )
            self.started[n] = time.time()
        for n, at in self.started.items():
            if n not in self.signalled and at + self.signal_after <= now:
                send_signal(SCOPE, f"soak-{n}", "go", {"n": n})
                self.signalled[n] = time.time()

    def markers(self) -> list[int]:
        return [FIRST + 2 * n + k for n in self.started for k in (0, 1)]

    def all_signalled(self) -> bool:
        return len(self.signalled) == len(self.started)

    def advances(self, reported: dict[int, float]) -> list[tuple[float, float, str]]:
        """(when it became due, latency in seconds, "timer" or "signal") of every
        advance, the timers' ``wake_at`` read from the database."""
        from workflows.models import WorkflowStep

        wake = {
            int(run_id.removeprefix("soak-")): at.timestamp()
            for run_id, at in WorkflowStep.objects.filter(
                run__name=WORKFLOW, key="nap"
            ).values_list("run__run_id", "wake_at")
            if at is not None
        }
        found = []
        for n in self.started:
            timer, signal = reported.get(FIRST + 2 * n), reported.get(FIRST + 2 * n + 1)
            if timer is not None and n in wake:
                found.append((wake[n], timer - wake[n], "timer"))
            if signal is not None and n in self.signalled:
                due = self.signalled[n]
                found.append((due, signal - due, "signal"))
        return found


def per_minute(
    advances: list[tuple[float, float, str]], start: float, minutes: float
) -> list[dict[str, Any]]:
    """Advances due in each minute of the run, and their latency p50 / p99 (ms)."""
    rows = []
    for minute in range(int(-(-minutes // 1))):
        low, high = start + 60 * minute, start + 60 * (minute + 1)
        late = [lat * 1000 for due, lat, _ in advances if low <= due < high]
        rows.append(
            {
                "advances": len(late),
                "advance_p50_ms": round(percentile(late, 0.5), 1) if late else None,
                "advance_p99_ms": round(percentile(late, 0.99), 1) if late else None,
            }
        )
    return rows


def verdicts(
    advances: list[tuple[float, float, str]], start: float, held: tuple[float, float]
) -> dict[str, Any]:
    """p99 before the pin (from the second minute: the first warms up), while it was
    held, and in the minute after; each against its target."""
    hold_from, hold_until = start + held[0], start + held[1]

    def p99(low: float, high: float) -> float | None:
        late = [lat * 1000 for due, lat, _ in advances if low <= due < high]
        return round(percentile(late, 0.99), 1) if late else None

    before = p99(start + 60, hold_from)
    pinned = p99(hold_from, hold_until)
    after = p99(hold_until, hold_until + 60)
    return {
        "p99_before_ms": before,
        "p99_pinned_ms": pinned,
        "p99_minute_after_ms": after,
        "pinned_ratio": _ratio(pinned, before),
        "pinned_ok": _within(pinned, before, PINNED_FACTOR),
        "after_ratio": _ratio(after, before),
        "back_within_a_minute": _within(after, before, BACK_FACTOR),
    }


def _ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else round(value / base, 2)


def _within(value: float | None, base: float | None, factor: float) -> bool | None:
    return None if value is None or base is None else value <= factor * base
