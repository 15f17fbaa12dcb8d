"""Batches and sequences, django-ledon alone (``--only ordering``, and the full run):

- a batch of ``batch_jobs`` no-op jobs submitted with ``submit_batch`` against the same
  jobs with ``submit_jobs`` (one call each, a fresh table each time);
- the batch's fan-in: the statements the worker's finishes send per job, for jobs of a
  batch and for the same jobs outside one — counted as Django records them
  (``CaptureQueriesContext``), the finishes made as the worker makes them
  (``complete_and_claim`` of ``FINISH_ROUND`` claims at a time);
- the drain of ``SEQUENCE_KEYS`` sequence keys × ``SEQUENCE_JOBS`` jobs against the
  same jobs without keys, one worker process at concurrency 16: jobs/s from the
  workers' start to the last end.

Every figure is a median over the plan's runs; the variants rotate from run to run.
"""

from __future__ import annotations

import time
from statistics import median
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import JobSubmission, execution, submit_batch, submit_jobs

from .systems.base import QUEUE
from .systems.ledon import HANDLERS

if TYPE_CHECKING:
    from .harness import Runner, System

#: Sequence keys of the drain, and jobs per key (the full run's; a quick plan scales
#: the keys down with its ``flow_burn_jobs``).
SEQUENCE_KEYS = 1_000
SEQUENCE_JOBS = 20
#: Claims a finish-and-claim finishes at a time in the fan-in's count.
FINISH_ROUND = 16
SCOPE = "bench-ordering"


def _noop(n: int, **rules: Any) -> JobSubmission:
    return JobSubmission.create(HANDLERS["noop"], {"n": n}, queue=QUEUE, **rules)


def batch_submit(runner: Runner, ours: System, count: int) -> dict[str, Any]:
    """Seconds to submit ``count`` jobs as one batch and with ``submit_jobs``."""
    from .harness import rotated

    raw: dict[str, list[float]] = {"submit_batch": [], "submit_jobs": []}
    for run in range(runner.plan.runs):
        for name in rotated(list(raw), run):
            runner.fresh(ours)
            jobs = [(f"row-{n}", _noop(n)) for n in range(count)]
            started = time.perf_counter()
            if name == "submit_batch":
                assert submit_batch(SCOPE, f"import-{run}", jobs).created
            else:
                assert all(r.created for r in submit_jobs([(SCOPE, j, s) for j, s in jobs]))
            seconds = time.perf_counter() - started
            raw[name].append(seconds)
            runner.log(f"  {name:12} {count:,} jobs in {seconds:.3f} s")
    medians = {name: median(values) for name, values in raw.items()}
    return {
        "jobs": count,
        "runs": raw,
        "median": medians,
        "ratio": medians["submit_batch"] / medians["submit_jobs"],
    }


def _statements_per_finish(count: int, in_batch: bool) -> dict[str, float]:
    """Claims and finishes ``count`` jobs as the worker does; the statements sent per
    job finished (the claims' statements included, the same for both)."""
    jobs = [(f"job-{n}", _noop(n)) for n in range(count)]
    if in_batch:
        submit_batch(SCOPE, "fan-in", jobs)
    else:
        submit_jobs([(SCOPE, job_id, sub) for job_id, sub in jobs])
    claims = execution.claim_due("bench", limit=FINISH_ROUND)
    with CaptureQueriesContext(connection) as queries:
        finished = 0
        while claims:
            finished += len(claims)
            _outcomes, claims = execution.complete_and_claim(
                [(claim, None) for claim in claims], "bench", limit=FINISH_ROUND
            )
    assert finished == count, (finished, count)
    return {"statements": len(queries), "per_job": len(queries) / count}


def fan_in(runner: Runner, ours: System, count: int) -> dict[str, Any]:
    """The statements per finished job, jobs of a batch and jobs of none."""
    figures = {}
    for name, in_batch in (("batch", True), ("no batch", False)):
        runner.fresh(ours)
        figures[name] = _statements_per_finish(count, in_batch)
        runner.log(f"  fan-in {name:9} {figures[name]['per_job']:.3f} statements per job")
    return {"jobs": count, "round": FINISH_ROUND, "figures": figures}


def sequence_drain(runner: Runner, ours: System, keys: int) -> dict[str, Any]:
    """Jobs/s of ``keys`` × :data:`SEQUENCE_JOBS` jobs, with sequence keys and without,
    one worker process at concurrency 16."""
    from .harness import rotated, workers
    from .systems import WorkerConfig

    count = keys * SEQUENCE_JOBS
    raw: dict[str, list[float]] = {"sequences": [], "no keys": []}
    for run in range(runner.plan.runs):
        for name in rotated(list(raw), run):
            runner.fresh(ours, count)
            # Job n goes to key n % keys: each key's jobs are spread over the whole
            # submission, as a stream of events per account is.
            items = [
                (
                    SCOPE,
                    f"s{n}",
                    _noop(n, sequence_key=f"acct-{n % keys}") if name == "sequences" else _noop(n),
                )
                for n in range(count)
            ]
            assert all(r.created for r in submit_jobs(items))
            start = time.time()
            with workers(ours, WorkerConfig(1, 16), runner.log_dir, f"sequences-{name}"):
                end = ours.wait_until_done(timeout=max(600.0, count / 20))
            rate = count / (end - start)
            raw[name].append(rate)
            runner.log(f"  drain {name:9} {rate:10.1f} jobs/s")
    medians = {name: median(values) for name, values in raw.items()}
    return {
        "keys": keys,
        "jobs_per_key": SEQUENCE_JOBS,
        "runs": raw,
        "median": medians,
        "ratio": medians["no keys"] / medians["sequences"],
    }


def ordering(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """The three measurements of this module (see its docstring)."""
    (ours,), plan = chosen, runner.plan
    batch_jobs = plan.flow_burn_jobs
    keys = max(10, SEQUENCE_KEYS * plan.flow_burn_jobs // 10_000)
    runner.log(f"batch submit: {batch_jobs:,} jobs, submit_batch and submit_jobs")
    submit = batch_submit(runner, ours, batch_jobs)
    runner.log("batch fan-in: statements per finished job")
    fan = fan_in(runner, ours, max(200, batch_jobs // 10))
    runner.log(f"sequences: {keys:,} keys × {SEQUENCE_JOBS} jobs, drained")
    drain = sequence_drain(runner, ours, keys)
    return {"submit": submit, "fan_in": fan, "sequences": drain}
