"""``python -m benchmarks.workflows``: the workflow engine against plain jobs on the
same workers, and against DBOS Transact (the ``dbos`` package) on the same
PostgreSQL server, in one run.

On a throw-away PostgreSQL with durable commits (or ``--database-url``), each in a
scratch database of its own:

- **a checkpoint against a job:** the time per inline checkpoint of a linear run of
  ``steps`` no-op steps, against the time per no-op job burned down by the same
  worker at concurrency 1;
- **a map against plain jobs:** a ``map`` of ``items`` no-op activity items, from the
  run's start to its end, against ``items`` plain no-op jobs on the same worker
  (one process at concurrency 16);
- **replay:** the advance after a signal of a run with ``replay_steps`` recorded
  checkpoints (claim, replay of every checkpoint, the wait's value, the finish), the
  checkpoints written in bulk as the engine would have recorded them; then a fork of
  that run from its wait (every checkpoint copied, the new run's snapshot returned);
- **DBOS Transact:** steps per second of a linear workflow, a fan-out of ``items``
  steps through a DBOS queue (polled every 50 ms, DBOS's default being 1 s), and
  from a signal's commit to the step after the wait, for both.

``--only map`` (or ``checkpoint``, ``signal``, ``replay``; repeatable) measures those
parts alone, and leaves DBOS out: a quicker loop while working on one of them.

Prints a table of figures and ratios and writes the raw JSON to
``benchmarks/results/workflows-<time>.json``; ``docs/benchmarks.md`` holds the
analysis of a run, written by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import AbstractContextManager, ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import report
from .harness import run_processes, wait_for
from .server import DATABASE_URL_HELP, django_on, scratch_database, server, server_settings
from .systems.base import ROOT
from .wf_ops import seed

SCOPE = "bench"
SETTINGS = "benchmarks.wf_settings"


def worker(url: str, concurrency: int, log: Path) -> AbstractContextManager[Any]:
    """One ``run_jobs`` process with the benchmark's workflows; stopped at the end."""
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": SETTINGS}
    command = [sys.executable, "-m", "django", "run_jobs", "--concurrency", str(concurrency)]
    return run_processes(command, env, [log], cwd=ROOT)


def _run_status(run_id: str) -> str:
    """The run's status; ``waiting`` only once it waits for a signal."""
    from workflows import WaitKind, WorkflowScope

    snapshot = WorkflowScope(SCOPE).get(run_id)
    if snapshot is None or (
        snapshot.status == "waiting"
        and (snapshot.wait is None or snapshot.wait.kind != WaitKind.SIGNAL)
    ):
        return ""
    return str(snapshot.status)


def _jobs_burn(count: int, tag: str) -> float:
    """Seconds to run ``count`` no-op jobs queued at once (the queue paused while they
    are submitted, then resumed)."""
    from jobs import JobStatus, execution
    from jobs.api import submit_job
    from jobs.models import Job
    from jobs.types import JobSubmission

    execution.pause_queue("default")
    submission = JobSubmission.create("wfbench.noop_job", {})
    for index in range(count):
        submit_job(SCOPE, f"{tag}-{index}", submission)
    started = time.perf_counter()
    execution.resume_queue("default")
    prefix = f"{tag}-"
    unfinished = Job.objects.filter(job_id__startswith=prefix).exclude(status=JobStatus.SUCCEEDED)
    wait_for(lambda: not unfinished.exists(), 600, "the jobs", poll=0.01)
    return time.perf_counter() - started


def _run_to_end(run_id: str, name: str, input: dict[str, Any]) -> float:
    """Seconds from the run's start to its end. Its end is polled as the jobs' burn
    polls theirs: one read of an index, not the run's snapshot (whose steps and
    items the poll would read every 10 ms beside the worker)."""
    from workflows import RunStatus, start_workflow, validation
    from workflows.models import WorkflowRun

    ended = WorkflowRun.objects.filter(
        scope_hash=validation.scope_hash(SCOPE), run_id=run_id, status__in=RunStatus.finished()
    )
    started = time.perf_counter()
    start_workflow(SCOPE, run_id, name, input)
    wait_for(ended.exists, 600, "the run", poll=0.01)
    took = time.perf_counter() - started
    assert _run_status(run_id) == "succeeded", f"run {run_id} ended {_run_status(run_id)}"
    return took


#: The parts of our side, as ``--only`` names them.
PARTS = ("checkpoint", "map", "signal", "replay")


def ours(
    url: str, sizes: dict[str, int], runs: int, logs: Path, parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    """Our figures of ``parts`` (the rounds of each, by name)."""
    result: dict[str, Any] = {}
    if "checkpoint" in parts:
        with worker(url, 1, logs / "ledon-c1.log"):
            _run_to_end("warm-up-c1", "wfbench.linear", {"steps": 1})  # the worker is up
            result.update(_checkpoints(sizes, runs))
    if "map" in parts or "signal" in parts:
        with worker(url, 16, logs / "ledon-c16.log"):
            _run_to_end("warm-up-c16", "wfbench.fan_out", {"items": 1})
            if "map" in parts:
                result.update(_maps(sizes, runs))
            if "signal" in parts:
                result["signal_latency"] = _signals(sizes["signals"])
    if "replay" in parts:
        result.update(_replays(sizes, runs))
    return result


def _checkpoints(sizes: dict[str, int], runs: int) -> dict[str, list[float]]:
    """A linear run's time per checkpoint against a no-op job's, at concurrency 1."""
    result: dict[str, list[float]] = {"checkpoint": [], "job_c1": []}
    for round_ in range(runs):
        took = _run_to_end(f"linear-{round_}", "wfbench.linear", {"steps": sizes["steps"]})
        result["checkpoint"].append(took / sizes["steps"])
        result["job_c1"].append(_jobs_burn(sizes["steps"], f"c1-{round_}") / sizes["steps"])
    return result


def _maps(sizes: dict[str, int], runs: int) -> dict[str, list[float]]:
    """A map's time from its run's start to its end against as many plain no-op jobs,
    on one worker at concurrency 16."""
    result: dict[str, list[float]] = {"map": [], "jobs_c16": []}
    for round_ in range(runs):
        result["map"].append(
            _run_to_end(f"map-{round_}", "wfbench.fan_out", {"items": sizes["items"]})
        )
        result["jobs_c16"].append(_jobs_burn(sizes["items"], f"c16-{round_}"))
    return result


def _signals(count: int) -> list[float]:
    """Seconds from a signal's send to the start of the step after its wait. The
    run's end is polled as :func:`_run_to_end` polls it (one read of an index), not
    through the run's snapshot, whose reads every 5 ms would take the CPU from the
    worker being timed."""
    from django.utils import timezone

    from workflows import RunStatus, WorkflowScope, send_signal, start_workflow, validation
    from workflows.models import WorkflowRun

    latencies = []
    for index in range(count):
        run_id = f"signal-{index}"
        start_workflow(SCOPE, run_id, "wfbench.signal", {})
        wait_for(lambda r=run_id: _run_status(r) == "waiting", 60, "the wait", poll=0.005)
        ended = WorkflowRun.objects.filter(
            scope_hash=validation.scope_hash(SCOPE), run_id=run_id, status__in=RunStatus.finished()
        )
        sent = timezone.now()
        send_signal(SCOPE, run_id, "go", {"n": index})
        wait_for(ended.exists, 60, "the run", poll=0.005)
        assert _run_status(run_id) == "succeeded", f"run {run_id} ended {_run_status(run_id)}"
        after = WorkflowScope(SCOPE).get(run_id).step("after")  # type: ignore[union-attr]
        latencies.append((after.started_at - sent).total_seconds())  # type: ignore[union-attr]
    return latencies


def _replays(sizes: dict[str, int], runs: int) -> dict[str, list[float]]:
    """The replay, timed in this process with no worker around: the advance that the
    signal queues, from its claim to its finish. The first round warms this process
    up (its first jobs run here) and is not kept. Then a fork of each run replayed
    (its first advance is queued, never run here)."""
    from workflows import WorkflowScope, send_signal
    from workflows.testing import run_workflows_inline

    seed("replay", runs + 1, sizes["replay_steps"])
    result: dict[str, list[float]] = {"replay": [], "fork": []}
    for round_ in range(runs + 1):
        run_id = f"replay-{round_}"
        send_signal(SCOPE, run_id, "go", {})
        started = time.perf_counter()
        run_workflows_inline()
        if round_:
            result["replay"].append(time.perf_counter() - started)
        assert _run_status(run_id) == "succeeded"
    for round_ in range(1, runs + 1):
        started = time.perf_counter()
        forked = WorkflowScope(SCOPE).fork(f"replay-{round_}", f"fork-{round_}", from_step="go")
        result["fork"].append(time.perf_counter() - started)
        assert len(forked.steps) == sizes["replay_steps"]
    return result


# --------------------------------------------------------------------------- DBOS


def dbos_part(url: str, sizes: dict[str, int], runs: int) -> dict[str, Any]:
    """DBOS Transact in this process (its own singleton): the same three shapes."""
    from dbos import DBOS

    DBOS(config={"name": "ledon-bench", "system_database_url": url, "run_admin_server": False})
    reached: dict[str, float] = {}

    @DBOS.step()
    def nothing(n: int) -> int:
        return n

    @DBOS.workflow()
    def linear(steps: int) -> int:
        for index in range(steps):
            nothing(index)
        return steps

    @DBOS.workflow()
    def fan_out(items: int) -> int:
        queue = DBOS.retrieve_queue("fan")
        handles = [queue.enqueue(nothing, index) for index in range(items)]
        return sum(handle.get_result() for handle in handles)

    @DBOS.step()
    def after(key: str) -> None:
        reached[key] = time.time()

    @DBOS.workflow()
    def signalled(key: str) -> None:
        DBOS.recv("go", timeout_seconds=60)
        after(key)

    DBOS.launch()
    DBOS.register_queue("fan", polling_interval_sec=0.05)
    result: dict[str, Any] = {"checkpoint": [], "map": [], "signal_latency": []}
    try:
        for _ in range(runs):
            started = time.perf_counter()
            linear(sizes["steps"])
            result["checkpoint"].append((time.perf_counter() - started) / sizes["steps"])
            started = time.perf_counter()
            fan_out(sizes["items"])
            result["map"].append(time.perf_counter() - started)
        for index in range(sizes["signals"]):
            key = f"s{index}"
            handle = DBOS.start_workflow(signalled, key)
            # Wait until the workflow is blocked in recv (its status says so).
            time.sleep(0.2)
            sent = time.time()
            DBOS.send(handle.workflow_id, {"n": index}, "go")
            handle.get_result()
            result["signal_latency"].append(reached[key] - sent)
    finally:
        DBOS.destroy()
    return result


# --------------------------------------------------------------------------- report


def table(raw: dict[str, Any]) -> str:
    """The figures (medians of the rounds) and their ratios as Markdown: a row for
    each part measured."""
    items, replayed = raw["sizes"]["items"], raw["sizes"]["replay_steps"]
    ours = {k: statistics.median(v) for k, v in raw["ledon"].items() if isinstance(v, list)}
    dbos = {k: statistics.median(v) for k, v in (raw.get("dbos") or {}).items()}
    # (measurement, ours, against, its figure, the ratio, the target)
    rows: list[tuple[str, float, str, float | None, float | None, str]] = []
    if "checkpoint" in ours:
        checkpoint = ours["checkpoint"]
        rows.append(("inline checkpoint (ms)", checkpoint * 1000, "no-op job at c1",
                     ours["job_c1"] * 1000, checkpoint / ours["job_c1"], ""))  # fmt: skip
    if "map" in ours:
        fan = ours["map"]
        rows.append((f"map of {items} items (s)", fan, "as many no-op jobs, c16",
                     ours["jobs_c16"], fan / ours["jobs_c16"], "≤ 1.3×"))  # fmt: skip
    if "replay" in ours:
        rows += [
            (f"replay of {replayed:,} checkpoints (ms)", ours["replay"] * 1000, "", None, None,
             "≤ 50 ms"),
            (f"fork of a run of {replayed:,} checkpoints (s)", ours["fork"], "", None, None,
             "≤ 1 s"),
        ]  # fmt: skip
    if dbos:
        checkpoint, fan, signal = ours["checkpoint"], ours["map"], ours["signal_latency"]
        rows += [
            ("linear: steps per second", 1 / checkpoint, "DBOS", 1 / dbos["checkpoint"],
             dbos["checkpoint"] / checkpoint, "> 1.0×"),
            (f"fan-out of {items} (s)", fan, "DBOS", dbos["map"], dbos["map"] / fan, "> 1.0×"),
            ("signal to next step (ms)", signal * 1000, "DBOS", dbos["signal_latency"] * 1000,
             dbos["signal_latency"] / signal, "> 1.0×"),
        ]  # fmt: skip
    elif "signal_latency" in ours:
        rows.append(("signal to next step (ms)", ours["signal_latency"] * 1000, "", None, None,
                     "p50 ≤ 10 ms"))  # fmt: skip
    head = ["measurement", "django-ledon", "against", "figure", "ratio", "target"]
    cells = [
        [what, f"{value:,.2f}", against, "" if figure is None else f"{figure:,.2f}",
         "" if ratio is None else f"{ratio:.2f}×", goal]
        for what, value, against, figure, ratio, goal in rows
    ]  # fmt: skip
    return report.table(head, cells)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workflows", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--database-url", help=DATABASE_URL_HELP)
    parser.add_argument("--no-dbos", action="store_true", help="leave DBOS Transact out")
    parser.add_argument(
        "--only",
        action="append",
        choices=PARTS,
        help="measure only this part of ours (repeatable); DBOS is left out",
    )
    parser.add_argument("--items", type=int, help="items of the map (default: 50 quick, 1000)")
    parser.add_argument("--steps", type=int, help="checkpoints of the linear runs")
    parser.add_argument(
        "--replay-steps",
        type=int,
        help="recorded checkpoints of the replayed and forked runs (default: 50 quick, 10000)",
    )
    parser.add_argument("--dbos-part", help=argparse.SUPPRESS)  # internal: the child
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    full = 50 if args.quick else 1000
    sizes = {
        "steps": args.steps or full,
        "items": args.items or full,
        "signals": 3 if args.quick else 20,
        "replay_steps": args.replay_steps or (50 if args.quick else 10_000),
    }
    if args.dbos_part:
        print(json.dumps(dbos_part(args.dbos_part, sizes, runs)))
        return
    parts = tuple(part for part in PARTS if part in (args.only or PARTS))
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        server_url = stack.enter_context(server(args.database_url))
        raw: dict[str, Any] = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "sizes": sizes,
            "runs": runs,
            "server": server_settings(server_url),
            "parts": parts,
            "load_average": os.getloadavg(),
        }
        ledon_url = stack.enter_context(scratch_database(server_url, "ledon_wf_bench"))
        django_on(ledon_url, stack, SETTINGS)
        raw["ledon"] = ours(ledon_url, sizes, runs, logs, parts)
        if not args.no_dbos and not args.only:
            dbos_url = stack.enter_context(scratch_database(server_url, "dbos_wf_bench"))
            child = [sys.executable, "-m", "benchmarks.workflows", "--dbos-part", dbos_url]
            child += ["--quick"] if args.quick else ["--runs", str(runs)]
            child += ["--items", str(sizes["items"]), "--steps", str(sizes["steps"])]
            output = subprocess.run(
                child, cwd=ROOT, check=True, capture_output=True, text=True
            ).stdout
            raw["dbos"] = json.loads(output.strip().splitlines()[-1])
    path = args.out / f"workflows-{raw['when'].replace(':', '')}.json"
    path.write_text(json.dumps(raw, indent=2))
    print(table(raw))
    print("load average at the start: " + ", ".join(f"{n:.2f}" for n in raw["load_average"]))
    print(f"raw results: {path}")


if __name__ == "__main__":
    main()
