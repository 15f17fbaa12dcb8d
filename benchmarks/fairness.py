"""Fair share and the submit-time rules, django-ledon alone (``--only fair-share``):

- the burn-down of one scope holding the whole queue, fair share on against
  ``"fair": False`` (one worker process at concurrency 16);
- the noisy neighbour: one scope's backlog of due no-op jobs (one bulk submit), then 99
  other scopes with 10 each submitted after it (one bulk submit each), one worker at
  concurrency 16: for each small scope, how long after its submission its last job
  started — fair share on, and in submission order;
- the cost of one submit: plain, with a ``unique_key`` and debounced (each call a new
  key: the insert path, which is the one that costs more), one call and one commit each.

Every figure is a median over the plan's runs; the variants rotate from run to run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from statistics import median
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connection
from django.test import override_settings

from jobs import JobSubmission, submit_job, submit_jobs

from .systems.base import QUEUE
from .systems.ledon import HANDLERS

if TYPE_CHECKING:
    from .harness import Runner, System

#: Small scopes of the noisy-neighbour run, and jobs each.
SMALL_SCOPES = 99
SMALL_JOBS = 10


@contextmanager
def queue_order(fair: bool) -> Iterator[dict[str, Any] | None]:
    """The harness's own ``JOBS`` with the benchmark queue fair or not (submits take
    their places by it), and the workers' ``JOBS`` additions to match."""
    if fair:
        yield None
        return
    workers = {"QUEUES": {QUEUE: {"fair": False}}}
    with override_settings(JOBS={**getattr(settings, "JOBS", {}), **workers}):
        yield workers


def _noop(n: int) -> JobSubmission:
    return JobSubmission.create(HANDLERS["noop"], {"n": n}, queue=QUEUE)


def burn_fair_and_not(runner: Runner, ours: System, count: int) -> dict[str, Any]:
    """Jobs/s of one scope's ``count`` jobs, fair share on and off."""
    from .harness import rotated
    from .systems import WorkerConfig

    raw: dict[str, list[float]] = {"fair": [], "submission order": []}
    for run in range(runner.plan.runs):
        for name in rotated(list(raw), run):
            with queue_order(name == "fair") as extra:
                rate = runner.burn_down(
                    ours, WorkerConfig(1, 16), count, settings=extra, variant=f"order-{name}"
                )
            raw[name].append(rate)
            runner.log(f"  {name:17} {rate:10.1f} jobs/s")
    medians = {name: median(values) for name, values in raw.items()}
    return {
        "jobs": count,
        "runs": raw,
        "median": medians,
        "ratio": medians["fair"] / medians["submission order"],
    }


def _small_scope_lags() -> list[float]:
    """Per small scope: seconds from its submission (its jobs' latest ``created_at``)
    to its last job's start."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM max(a.started_at) - max(j.created_at))"
            " FROM jobs_job AS j JOIN jobs_jobattempt AS a ON a.job_id = j.id"
            " WHERE j.job_id LIKE 'small-%%' GROUP BY j.scope_hash"
        )
        return [float(row[0]) for row in cursor.fetchall()]


def noisy_neighbour(runner: Runner, ours: System, backlog: int, fair: bool) -> dict[str, float]:
    """One run: ``backlog`` jobs of one scope, then the small scopes, into a worker at
    concurrency 16; the small scopes' lags and the run's jobs/s."""
    from .harness import workers
    from .systems import WorkerConfig

    runner.fresh(ours, backlog)
    with queue_order(fair) as extra:
        tag = f"noisy-{'fair' if fair else 'order'}"
        env = {"BENCH_JOBS": json.dumps(extra)} if extra else None
        with workers(ours, WorkerConfig(1, 16), runner.log_dir, tag, env):
            ours.seed(1)
            ours.wait_until_done(timeout=60, poll=0.02)
            start = time.time()
            jobs = [("big", f"big-{n}", _noop(n)) for n in range(backlog)]
            assert all(result.created for result in submit_jobs(jobs))
            # Each small scope's jobs in one call: 99 quick submits behind the backlog.
            for scope in range(SMALL_SCOPES):
                name = f"small-{scope}"
                small = [(name, f"{name}-{n}", _noop(n)) for n in range(SMALL_JOBS)]
                assert all(result.created for result in submit_jobs(small))
            end = ours.wait_until_done(timeout=max(300.0, backlog / 50))
    lags = _small_scope_lags()
    total = backlog + SMALL_SCOPES * SMALL_JOBS
    return {"max_lag": max(lags), "median_lag": median(lags), "rate": total / (end - start)}


def submit_costs(runner: Runner, ours: System, count: int) -> dict[str, Any]:
    """Microseconds per submit: plain, unique and debounced, one call each."""
    from .harness import rotated

    variants: dict[str, dict[str, Any]] = {
        "plain": {},
        "unique": {"unique_key": "u"},
        "debounced": {"unique_key": "d", "debounce": 60},
    }
    raw: dict[str, list[float]] = {name: [] for name in variants}
    for run in range(runner.plan.runs):
        for name in rotated(list(variants), run):
            runner.fresh(ours)
            rules = variants[name]
            subs = [
                JobSubmission.create(
                    HANDLERS["noop"],
                    {"n": n},
                    queue=QUEUE,
                    **{k: f"{v}{n}" if k == "unique_key" else v for k, v in rules.items()},
                )
                for n in range(count)
            ]
            started = time.perf_counter()
            for n, sub in enumerate(subs):
                submit_job("bench", f"s{run}-{n}", sub)
            micros = (time.perf_counter() - started) / count * 1e6
            raw[name].append(micros)
            runner.log(f"  submit {name:10} {micros:8.1f} µs")
    medians = {name: median(values) for name, values in raw.items()}
    return {
        "submits": count,
        "runs": raw,
        "median": medians,
        "ratio": {name: medians[name] / medians["plain"] for name in variants if name != "plain"},
    }


def fair_share(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """The three measurements of this module (see its docstring)."""

    (ours,), plan = chosen, runner.plan
    runner.log("fair share: one scope's burn-down, fair and in submission order")
    burn = burn_fair_and_not(runner, ours, plan.flow_burn_jobs)
    backlog = plan.flow_burn_jobs * 5
    runner.log(f"noisy neighbour: {backlog:,} jobs of one scope, then 99 scopes of 10")
    noisy: dict[str, list[dict[str, float]]] = {"fair": [], "submission order": []}
    for run in range(plan.runs):
        for name in ["fair", "submission order"] if run % 2 == 0 else ["submission order", "fair"]:
            figures = noisy_neighbour(runner, ours, backlog, name == "fair")
            noisy[name].append(figures)
            runner.log(
                f"  {name:17} last small job started {figures['max_lag']:.2f} s after its"
                f" submission (median {figures['median_lag']:.2f} s), {figures['rate']:.0f} jobs/s"
            )
    runner.log("submit cost: plain, unique, debounced")
    submits = submit_costs(runner, ours, max(200, plan.flow_burn_jobs // 5))
    return {
        "burn": burn,
        "noisy": {
            "backlog": backlog,
            "small_scopes": SMALL_SCOPES,
            "small_jobs": SMALL_JOBS,
            "runs": noisy,
            "median": {
                name: {key: median(run[key] for run in runs) for key in runs[0]}
                for name, runs in noisy.items()
            },
        },
        "submit": submits,
    }
