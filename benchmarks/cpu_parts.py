"""The worker's own CPU per job, by part: a django-ledon worker run in this process
over queued no-op jobs, its process's CPU time (user and system, ``getrusage``) per
job, and each part's share from the CPU clock of the thread that ran it
(``time.thread_time`` around the functions below, each part counted without the
parts it calls).

The parts:

- **claim and finish** — :func:`jobs.execution.complete_and_claim`: the Python of the
  worker's one statement (arguments, parameters, psycopg's execute and its rows read
  back into claims); the server's time is not this process's CPU;
- **settle** — :meth:`Settler.settle` around it: the capacity asked for, the held
  attempts added and dropped, the claims handed over;
- **hand-over** — a claim queued for a slot and taken by its thread (the work queue),
  a returned handler's success handed to the next settle
  (:meth:`Settler.defer_completion`), a slot set free (:meth:`Slots.release`);
- **attempt** — the handler looked up, its middleware chain, the (no-op) handler
  run (or an ``async def`` one started on the loop), its end decided;
- **slot** — the rest of a slot's work for one attempt: its end written or handed
  to the next settle (:meth:`Slots._execute`, :meth:`Slots._handler_returned`);
- **heartbeat** — lease renewals and cancellation checks (:class:`LeaseKeeper`);
- **logging and metrics** — each end counted, logged, signalled and reported
  (:meth:`Finisher.record`);
- **main loop** — the rest of :meth:`Worker._loop_until_stopped`;
- **the rest** — the process's CPU less the parts: the threads' waits and wake-ups,
  the interpreter lock handed between threads, garbage collection, threads of no part.

The timers cost a few microseconds a job, so the process's CPU per job is measured
first in a run without them. ``--instructions`` counts the instructions instead
(``valgrind --tool=callgrind``): the same worker over ``--jobs`` jobs and over none,
each in a process of its own, the difference per job — a figure that does not move
with what else the machine runs.

Alone: ``python -m benchmarks.cpu_parts [--database-url URL] [--jobs N]
[--concurrency 16] [--instructions]``; ``make bench`` runs it in its profile part.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

from . import physical

#: The parts, in the order the report lists them: (name, [(module, owner, attribute)]);
#: a place a tree does not have is left out.
PARTS: tuple[tuple[str, tuple[tuple[str, str, str], ...]], ...] = (
    ("claim and finish", (("jobs.execution", "", "complete_and_claim"),)),
    ("settle", (("jobs.worker.settler", "Settler", "settle"),)),
    (
        "hand-over",
        (
            ("jobs.worker.slots", "Slots", "hand_over"),
            ("jobs.worker.settler", "Settler", "defer_completion"),
            ("jobs.worker.settler", "Settler", "defer"),
            ("jobs.worker.slots", "Slots", "release"),
            ("jobs.worker.workqueue", "WorkQueue", "get"),
            ("jobs.worker.workqueue", "WorkQueue", "put_many"),
            ("jobs.worker.workqueue", "WorkQueue", "put_first"),
        ),
    ),
    (
        "attempt",
        (
            ("jobs.worker.slots", "", "run_attempt"),
            ("jobs.worker.slots", "Slots", "_run_handler"),
            ("jobs.worker.slots", "Slots", "_start_on_loop"),
        ),
    ),
    (
        "slot",
        (
            ("jobs.worker.slots", "Slots", "_execute"),
            ("jobs.worker.slots", "Slots", "_handler_returned"),
            ("jobs.worker.slots", "Slots", "_loop_returned"),
        ),
    ),
    (
        "heartbeat",
        (
            ("jobs.worker.leases", "LeaseKeeper", "heartbeat"),
            ("jobs.worker.leases", "LeaseKeeper", "check_cancel"),
        ),
    ),
    ("logging and metrics", (("jobs.worker.finishing", "Finisher", "record"),)),
    ("main loop", (("jobs.worker.engine", "Worker", "_loop_until_stopped"),)),
)


def process_cpu() -> float:
    """This process's CPU seconds so far, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class ThreadClocks:
    """CPU seconds spent inside wrapped functions, by part, on each thread's own clock;
    a part's time excludes the wrapped functions it calls."""

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self.local = threading.local()
        self.lock = threading.Lock()
        self.per_thread: list[dict[str, float]] = []

    def _totals(self) -> tuple[dict[str, float], list[float]]:
        local = self.local
        totals = getattr(local, "totals", None)
        if totals is None:
            totals = local.totals = {}
            local.stack = []
            with self.lock:
                self.per_thread.append(totals)
        return totals, local.stack

    def wrap(self, part: str, func: Callable[..., Any]) -> Callable[..., Any]:
        clock = self.clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            totals, stack = self._totals()
            stack.append(0.0)
            start = clock()
            try:
                return func(*args, **kwargs)
            finally:
                elapsed = clock() - start
                inner = stack.pop()
                totals[part] = totals.get(part, 0.0) + elapsed - inner
                if stack:
                    stack[-1] += elapsed

        return timed

    def totals(self) -> dict[str, float]:
        merged: dict[str, float] = {}
        with self.lock:
            for totals in self.per_thread:
                for part, seconds in totals.items():
                    merged[part] = merged.get(part, 0.0) + seconds
        return merged


@contextmanager
def timed_parts(clocks: ThreadClocks) -> Iterator[None]:
    """Every function of :data:`PARTS` wrapped by ``clocks`` for the block."""
    import importlib

    with ExitStack() as stack:
        for part, places in PARTS:
            for module_name, owner_name, attribute in places:
                try:
                    module = importlib.import_module(module_name)
                except ImportError:
                    continue
                owner = getattr(module, owner_name, None) if owner_name else module
                original = getattr(owner, attribute, None)
                if original is None:
                    continue
                stack.enter_context(
                    mock.patch.object(owner, attribute, clocks.wrap(part, original))
                )
        yield


def run_worker(concurrency: int, clocks: ThreadClocks | None = None) -> tuple[float, int]:
    """A burst worker over the queued jobs: the CPU seconds this process spent, and
    the jobs that succeeded."""
    from jobs.handlers import autodiscover
    from jobs.worker import Worker

    autodiscover()  # as run_jobs does: the handlers of benchmarks/tasks.py
    worker = Worker(concurrency=concurrency, burst=True, listen=False)
    with timed_parts(clocks) if clocks is not None else ExitStack():
        before = process_cpu()
        stats = worker.run()
        spent = process_cpu() - before
    if stats.failed or stats.put_back:
        raise RuntimeError(f"the worker's jobs did not succeed: {stats.summary()}")
    return spent, stats.succeeded


def _queue(ledon: Any, admin: Callable[[str], None], jobs: int) -> None:
    ledon.reset()
    if jobs:
        ledon.seed(jobs)
        admin("ANALYZE")


def measure(
    ledon: Any,
    admin: Callable[[str], None],
    jobs: int,
    concurrencies: tuple[int, ...] = (16,),
    log: Callable[[str], None] = physical.log,
) -> dict[str, Any]:
    """At each of ``concurrencies``: the process's CPU ms per job (a run without
    timers), and each part's (a run with them)."""
    result: dict[str, Any] = {"jobs": jobs}
    for concurrency in concurrencies:
        _queue(ledon, admin, jobs)
        cpu, done = run_worker(concurrency)
        _queue(ledon, admin, jobs)
        clocks = ThreadClocks()
        timed_cpu, timed_done = run_worker(concurrency, clocks)
        if done != jobs or timed_done != jobs:
            raise RuntimeError(f"{jobs} jobs queued, {done} and {timed_done} succeeded")
        totals = clocks.totals()
        parts = {part: totals.get(part, 0.0) * 1000 / jobs for part, _ in PARTS}
        parts["the rest"] = max(timed_cpu * 1000 / jobs - sum(parts.values()), 0.0)
        entry = {
            "cpu_ms_per_job": cpu * 1000 / jobs,
            "timed_cpu_ms_per_job": timed_cpu * 1000 / jobs,
            "parts_ms_per_job": parts,
        }
        result[f"c{concurrency}"] = entry
        log(
            f"  CPU per job c{concurrency}: {entry['cpu_ms_per_job']:.3f} ms; "
            + ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
        )
    ledon.reset()
    return result


# --------------------------------------------------------------------------- instructions

_TOTALS = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.MULTILINE)


def _instructions(env: dict[str, str], concurrency: int) -> int:
    """Instructions of one process that runs a burst worker over the queued jobs
    (start-up included), counted by callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                sys.executable, "-m", "benchmarks.cpu_parts", "--worker-only",
                "--concurrency", str(concurrency),
            ],
            env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        match = _TOTALS.search(out.read_bytes())
        if match is None:
            raise RuntimeError("callgrind wrote no totals")
        return int(match.group(1))


def instructions(
    ledon: Any, admin: Callable[[str], None], jobs: int, concurrency: int
) -> dict[str, Any]:
    """Instructions per job: a worker process over ``jobs`` jobs less one over none."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    _queue(ledon, admin, 0)
    empty = _instructions(env, concurrency)
    _queue(ledon, admin, jobs)
    full = _instructions(env, concurrency)
    ledon.reset()
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "start_up_instructions": empty,
        "instructions_per_job": (full - empty) / jobs,
    }


# --------------------------------------------------------------------------- alone


def main(argv: list[str] | None = None) -> int:
    from .server import DATABASE_URL_HELP

    parser = argparse.ArgumentParser(prog="python -m benchmarks.cpu_parts", description=__doc__)
    parser.add_argument("--database-url", help=DATABASE_URL_HELP)
    parser.add_argument("--jobs", type=int, default=3_000)
    parser.add_argument("--concurrency", type=int, action="append")
    parser.add_argument("--instructions", action="store_true", help="count instructions too")
    parser.add_argument("--worker-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    concurrencies = tuple(args.concurrency or [16])
    if args.worker_only:  # the process callgrind counts: Django is set up by the env
        import django

        django.setup()
        run_worker(concurrencies[0])
        return 0

    from . import server

    with ExitStack() as stack:
        name = "ledon_cpu"
        _server_url, url = stack.enter_context(server.database(args.database_url, name))
        admin = server.django_on(url, stack)
        from .systems.ledon import Ledon

        ledon = Ledon(url)
        result = measure(ledon, admin, args.jobs, concurrencies)
        for concurrency in concurrencies if args.instructions else ():
            counted = instructions(ledon, admin, args.jobs, concurrency)
            result[f"c{concurrency}"]["instructions"] = counted
            physical.log(
                f"  instructions per job c{concurrency}: {counted['instructions_per_job']:,.0f}"
            )
    print(format_table(result))
    return 0


def format_table(result: dict[str, Any]) -> str:
    """The CPU per job by part, one column per concurrency."""
    keys = [k for k in result if k.startswith("c") and k[1:].isdigit()]
    rows = [
        [
            "process CPU per job (ms, no timers)",
            *(f"{result[k]['cpu_ms_per_job']:.3f}" for k in keys),
        ]
    ]
    for part in [p for p, _ in PARTS] + ["the rest"]:
        rows.append([part, *(f"{result[k]['parts_ms_per_job'][part]:.3f}" for k in keys)])
    counted = [result[k].get("instructions") for k in keys]
    if any(counted):
        rows.append(
            [
                "instructions per job",
                *(f"{c['instructions_per_job']:,.0f}" if c else "" for c in counted),
            ]
        )
    header = ["part", *(f"concurrency {k[1:]}" for k in keys)]
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * len(keys)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
