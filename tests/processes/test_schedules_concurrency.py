"""Schedules under contention: eight threads of this process and three other processes call
``enqueue_due_schedules`` at once, for each of 100 simulated periods of two schedules.
Exactly one job per period results, each created by exactly one caller, and no
caller sees an error — on SQLite and PostgreSQL."""

from __future__ import annotations

import multiprocessing
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from tests.support.procs import database_url
from tests.support.schedules import period_jobs, row, schedules  # noqa: F401  (fixture)
from tests.support.schedules_race import PERIOD, START, declare, in_process, run_rounds

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("schedules"),
    pytest.mark.slow,
]

THREADS = 8
PROCESSES = 3
ROUNDS = 100


def test_eight_threads_and_three_processes_make_exactly_one_job_per_period():
    declare()
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(THREADS + PROCESSES)
    results = context.Queue()
    processes = [
        context.Process(target=in_process, args=(database_url(), barrier, ROUNDS, results))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()

    def thread_caller() -> list[tuple[int, list[tuple[str, bool]], str]]:
        try:
            return run_rounds(barrier, ROUNDS)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(thread_caller) for _ in range(THREADS)]
        outcomes = [future.result(timeout=600) for future in futures]
    outcomes += [results.get(timeout=600)[1] for _ in processes]
    for process in processes:
        process.join(60)
        assert process.exitcode == 0

    errors = [error for caller in outcomes for _n, _jobs, error in caller if error]
    assert errors == []
    expected = [
        f"{name}@{(START + n * PERIOD).strftime('%Y-%m-%dT%H:%M:%SZ')}"
        for n in range(ROUNDS)
        for name in ("race-cron", "race-interval")
    ]
    assert sorted(period_jobs()) == sorted(expected)  # one job per period, none missing
    creators = Counter(
        job_id for caller in outcomes for _n, jobs, _e in caller for job_id, new in jobs if new
    )
    assert set(creators) == set(expected)
    assert set(creators.values()) == {1}  # each job created by exactly one caller
    # Every caller ran every round against the same clock: the late ones found the
    # period done (nothing returned) or its job already there (created False).
    assert all(len(caller) == ROUNDS for caller in outcomes)
    for name in ("race-cron", "race-interval"):
        state = row(name)
        assert state.last_period == START + (ROUNDS - 1) * PERIOD
        assert state.next_run_at == START + ROUNDS * PERIOD
