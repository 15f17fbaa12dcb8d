"""Where one job's time goes: a django-ledon worker run in this process at concurrency
1 and 4, timed part by part, profiled, and the server's side read from
``pg_stat_statements``, ``pg_stat_wal`` and ``EXPLAIN (ANALYZE, BUFFERS, WAL)``.

``make bench`` runs it after the other measurements (the ``profile`` and
``slot_profile`` parts of the results); ``python -m benchmarks --only profile`` runs it
alone and prints the breakdown.

The breakdown of one job (ms, per job; at concurrency above 1 the parts run on several
threads at once, so they add up to more than the wall time per job):

- **Python around the statement** — ``complete_and_claim`` less the statement: the
  arguments checked, the parameters built, the rows read back into claims;
- **statement** — psycopg's ``execute`` of the finish-and-claim statement, split into
  the **server's execution** (``pg_stat_statements``), the **commit**'s WAL flush
  (``pg_stat_wal``: sync time per sync, times syncs per job) and the **round trip**
  (the rest: network, protocol, bind; a prepared ``SELECT 1`` is given for scale);
- **hand-off and handler** — a slot's run of the attempt (:meth:`Slots._run_handler`:
  finding the handler, calling it inside its middleware, deciding the end and handing
  it on);
- **return to the next statement** — the rest of the wall time: the worker's own
  book-keeping between a handler's return and the next statement (queues, locks,
  counters, events), and, at concurrency above 1, threads waiting for each other.

Timers wrap those functions (about a microsecond each); :mod:`cProfile` runs
separately, since it slows the Python it measures, and gives the functions that cost
the most.
"""

from __future__ import annotations

import cProfile
import itertools
import pstats
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any
from unittest import mock

from . import physical


class _Timers:
    """Wall time spent inside wrapped functions, summed over every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.totals: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.local = threading.local()

    def wrap(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self.local, name, 0)
            setattr(self.local, name, depth + 1)
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                setattr(self.local, name, depth)
                if depth == 0:  # a nested call is inside its outer call's time
                    elapsed = time.perf_counter() - start
                    with self.lock:
                        self.totals[name] = self.totals.get(name, 0.0) + elapsed
                        self.calls[name] = self.calls.get(name, 0) + 1

        return timed


def _patched(*patches: tuple[Any, str, Callable[..., Any]]) -> ExitStack:
    """Replace each ``(owner, name, replacement)`` for the block (where the worker
    looks the name up)."""
    stack = ExitStack()
    for owner, name, replacement in patches:
        stack.enter_context(mock.patch.object(owner, name, replacement))
    return stack


def _queue(ledon: Any, admin: Callable[[str], None], jobs: int, kind: str = "noop") -> None:
    """An empty table, then ``jobs`` queued jobs of the ``kind`` handler, analysed."""
    ledon.reset()
    ledon.seed(jobs, kind)
    admin("ANALYZE")


def _run_worker(concurrency: int, profile: bool) -> tuple[float, pstats.Stats | None]:
    """Run a burst worker over the queued jobs; the seconds from the first attempt's
    start to the last job's end, as the database recorded them, and with ``profile``
    the profile of every thread of the worker."""
    from django.db import connection

    from jobs.handlers import autodiscover
    from jobs.worker import Worker

    autodiscover()  # as run_jobs does: the handlers of benchmarks/tasks.py
    worker = Worker(concurrency=concurrency, burst=True, listen=False)
    # Python 3.12 and later: cProfile is built on sys.monitoring, whose events come
    # from every thread — one profiler sees the handler threads too.
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    try:
        worker.run()
    finally:
        if profiler is not None:
            profiler.disable()
    stats = pstats.Stats(profiler) if profiler is not None else None
    with connection.cursor() as cursor:
        cursor.execute(
            f"{physical.HARNESS_MARK} SELECT extract(epoch FROM max(j.finished_at)"
            " - min(a.started_at)) FROM jobs_job j JOIN jobs_jobattempt a ON a.job_id = j.id"
        )
        return float(cursor.fetchone()[0]), stats


def _top(stats: pstats.Stats, jobs: int, count: int = 15) -> list[dict[str, Any]]:
    rows = []
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, line, function), (_cc, calls, tottime, cumtime, _callers) in table.items():
        where = "/".join(filename.split("/")[-2:])
        rows.append(
            {
                "function": f"{where}:{line}({function})",
                "calls_per_job": calls / jobs,
                "own_us_per_job": tottime * 1e6 / jobs,
                "cumulative_us_per_job": cumtime * 1e6 / jobs,
            }
        )
    rows.sort(key=lambda r: -r["own_us_per_job"])
    return rows[:count]


def _server(url: str, statements: bool) -> dict[str, Any]:
    """The finish-and-claim statement's server figures (with ``statements``, when
    ``pg_stat_statements`` is loaded) and the WAL syncs since the last reset."""
    with physical._connect(url) as conn:
        statement = None
        if statements:
            statement = conn.execute(
                "SELECT calls, mean_exec_time, shared_blks_hit, shared_blks_read,"
                " shared_blks_dirtied, wal_records, wal_bytes FROM pg_stat_statements"
                " WHERE toplevel AND query LIKE 'WITH done AS%%claimed AS (UPDATE%%'"
                " ORDER BY calls DESC LIMIT 1"
            ).fetchone()
        wal = conn.execute(
            "SELECT wal_records, wal_bytes, wal_write, wal_sync, wal_write_time, wal_sync_time"
            " FROM pg_stat_wal"
        ).fetchone()
    out: dict[str, Any] = {}
    if statement is not None:
        names = ("calls", "mean_exec_ms", "blks_hit", "blks_read", "blks_dirtied")
        values = [float(v) for v in statement]
        out["statement"] = dict(zip(names, values[:5], strict=True))
        out["statement"]["wal_records"], out["statement"]["wal_bytes"] = values[5:]
    names = ("records", "bytes", "writes", "syncs", "write_ms", "sync_ms")
    out["wal"] = dict(zip(names, (float(v) for v in wal), strict=True))
    return out


def _reset_server(url: str, statements: bool) -> None:
    with physical._connect(url) as conn:
        if statements:
            conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset_shared('wal')")


def round_trip_ms(url: str, samples: int = 2_000) -> float:
    """Median time of a prepared ``SELECT 1``: the round trip with no work in it."""
    times = []
    with physical._connect(url) as conn:
        conn.prepare_threshold = 0
        for _ in range(samples):
            start = time.perf_counter()
            conn.execute("SELECT 1", prepare=True).fetchall()
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def explain(url: str) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, BUFFERS, WAL)`` of the finish-and-claim statement for one
    running attempt and one queued job, rolled back."""
    import psycopg
    from django.utils import timezone

    from jobs import execution
    from jobs.store import sql

    claim = execution.claim_due("profile-explain", limit=1)[0]
    now = timezone.now()
    params = physical.finish_and_claim_params(
        "profile-explain", now, now, 1, [physical.succeeded(claim.token)]
    )
    statement = sql.claim("postgresql", queues=0, one_job=False, finishing=True)
    with psycopg.connect(url) as conn:
        cursor = psycopg.ClientCursor(conn)
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + statement, params)
        plan = cursor.fetchone()[0][0]
        conn.rollback()
    execution.complete(claim.token)
    top = plan["Plan"]
    return {
        "planning_ms": plan.get("Planning Time"),
        "execution_ms": plan.get("Execution Time"),
        "shared_hit_blocks": top.get("Shared Hit Blocks"),
        "shared_dirtied_blocks": top.get("Shared Dirtied Blocks"),
        "wal_records": top.get("WAL Records"),
        "wal_bytes": top.get("WAL Bytes"),
        "wal_fpi": top.get("WAL FPI"),
        "triggers": [
            {"name": t.get("Trigger Name"), "ms": t.get("Time"), "calls": t.get("Calls")}
            for t in plan.get("Triggers", [])
        ],
    }


def profile(
    url: str,
    ledon: Any,
    admin: Callable[[str], None],
    jobs: int,
    concurrencies: tuple[int, ...] = (1, 4),
    log: Callable[[str], None] = physical.log,
) -> dict[str, Any]:
    """The breakdown of one job at each of ``concurrencies`` (see the module's
    docstring), with the cProfile top and the statement's plan."""
    from psycopg import Cursor

    from jobs import execution
    from jobs.worker.slots import Slots

    statements = physical.statements_available(url)
    result: dict[str, Any] = {"jobs": jobs, "round_trip_ms": round_trip_ms(url)}
    for concurrency in concurrencies:
        # Timed run.
        _queue(ledon, admin, jobs)
        admin("CHECKPOINT")
        _reset_server(url, statements)
        timers = _Timers()
        parts = [(execution, "complete_and_claim"), (Slots, "_run_handler"), (Cursor, "execute")]
        with _patched(*((o, n, timers.wrap(n, getattr(o, n))) for o, n in parts)):
            span, _ = _run_worker(concurrency, profile=False)
        time.sleep(1.1)  # backends flush their WAL statistics when they end
        server = _server(url, statements)
        wall_ms = span * 1000 / jobs

        def per_job(name: str, timers: _Timers = timers) -> float:
            return timers.totals.get(name, 0.0) * 1000 / jobs

        statement_ms = per_job("execute")
        python_ms = per_job("complete_and_claim") - statement_ms
        handler_ms = per_job("_run_handler")
        wal = server["wal"]
        sync_ms = wal["sync_ms"] / wal["syncs"] if wal["syncs"] else 0.0
        commit_ms = sync_ms * wal["syncs"] / jobs
        stmt = server.get("statement") or {}
        exec_ms = (stmt.get("mean_exec_ms") or 0.0) * (stmt.get("calls") or 0) / jobs
        parts = {
            "python_around_statement_ms": python_ms,
            "server_execution_ms": exec_ms,
            "commit_wal_flush_ms": commit_ms,
            "round_trip_ms": max(statement_ms - exec_ms - commit_ms, 0.0),
            "handoff_and_handler_ms": handler_ms,
        }
        # At concurrency 1 the parts follow each other on one thread: the rest of the
        # wall time is the worker's own between them. Above 1 they overlap.
        parts["return_to_next_statement_ms"] = (
            max(wall_ms - sum(parts.values()), 0.0) if concurrency == 1 else None
        )
        entry: dict[str, Any] = {
            "wall_ms_per_job": wall_ms,
            "jobs_per_s": jobs / span,
            "statement_ms": statement_ms,
            "statements_per_job": timers.calls.get("execute", 0) / jobs,
            "settles_per_job": timers.calls.get("complete_and_claim", 0) / jobs,
            "wal_syncs_per_job": wal["syncs"] / jobs,
            "wal_sync_ms": sync_ms,
            "server": server,
            **parts,
        }
        # Profiled run.
        _queue(ledon, admin, jobs)
        span_profiled, stats = _run_worker(concurrency, profile=True)
        assert stats is not None
        entry["profiled_jobs_per_s"] = jobs / span_profiled
        entry["top"] = _top(stats, jobs)
        result[f"c{concurrency}"] = entry
        log(
            f"  profile c{concurrency}: "
            + ", ".join(f"{k} {v:.3f}" for k, v in entry.items() if isinstance(v, float))
        )
    ledon.reset()
    ledon.seed(2)
    result["explain"] = explain(url)
    ledon.reset()
    return result


def slot_profile(
    url: str,
    ledon: Any,
    admin: Callable[[str], None],
    jobs: int,
    concurrency: int = 16,
    log: Callable[[str], None] = physical.log,
) -> dict[str, Any]:
    """Where a handler thread's time goes with a handler that sleeps 5 ms: a burst
    worker in this process at ``concurrency`` over ``jobs`` such jobs, each slot
    followed from one handler's start to the start of the next one on the same thread.

    A slot's turn is its handler (the 5 ms sleep, its call, and the wait for the
    interpreter lock when the sleep ends) and its way to the next job, split into
    **waiting for a claim** (the slot came for its next job before the settle that
    claimed it had committed: the look-ahead had run dry), **woken** (from the later
    of the slot's coming and its claim's commit to the slot holding the claim: the
    wake-up of a waiting thread and the interpreter lock) and **the rest** (the
    slot's own book-keeping: its success handed to the next settle, the job found).
    Means in ms per turn; the settles' statements (their round trip, jobs per settle,
    and with ``pg_stat_statements`` the server's execution) and the WAL syncs from
    ``pg_stat_wal``."""
    from jobs import execution
    from jobs.types import Claim
    from jobs.worker import slots
    from jobs.worker.settler import Settler
    from jobs.worker.workqueue import WorkQueue

    lock = threading.Lock()
    committed: dict[str, float] = {}
    #: token -> (thread, when its handler started)
    started: dict[str, tuple[int, float]] = {}
    returned: dict[str, float] = {}
    #: token -> (when its slot came to the queue, when it took the claim)
    taken: dict[str, tuple[float, float]] = {}
    statements: list[tuple[float, int]] = []
    complete_and_claim = execution.complete_and_claim
    begin_attempt = slots.begin_attempt
    defer = Settler.defer
    get = WorkQueue.get

    def timed_settle(done: Any, *args: Any, **kwargs: Any) -> Any:
        begin = time.perf_counter()
        outcomes, claims = complete_and_claim(done, *args, **kwargs)
        end = time.perf_counter()
        with lock:
            statements.append((end - begin, len(done)))
            for claim in claims:
                committed[claim.token] = end
        return outcomes, claims

    def timed_attempt(ctx: Any, *args: Any) -> Any:
        with lock:
            started[ctx.token] = (threading.get_ident(), time.perf_counter())
        return begin_attempt(ctx, *args)

    def timed_defer(settler: Any, claim: Any, result: Any) -> Any:
        with lock:
            returned[claim.token] = time.perf_counter()
        return defer(settler, claim, result)

    def timed_get(queue: Any) -> Any:
        came = time.perf_counter()
        item = get(queue)
        if isinstance(item, Claim):
            with lock:
                taken[item.token] = (came, time.perf_counter())
        return item

    _queue(ledon, admin, jobs, "sleep5")
    admin("CHECKPOINT")
    statements_known = physical.statements_available(url)
    _reset_server(url, statements_known)
    patches = [
        (execution, "complete_and_claim", timed_settle),
        (slots, "begin_attempt", timed_attempt),
        (Settler, "defer", timed_defer),
        (WorkQueue, "get", timed_get),
    ]
    with _patched(*patches):
        span, _ = _run_worker(concurrency, profile=False)
    time.sleep(1.1)  # backends flush their WAL statistics when they end
    server = _server(url, statements_known)
    wal = server["wal"]
    handler: list[float] = []
    next_job: list[float] = []
    waiting: list[float] = []
    woken: list[float] = []
    by_thread: dict[int, list[tuple[float, str]]] = {}
    for token, (thread, at) in started.items():
        by_thread.setdefault(thread, []).append((at, token))
    for turns in by_thread.values():
        turns.sort()
        for (at, token), (next_at, next_token) in itertools.pairwise(turns):
            if token not in returned:
                continue
            handler.append(returned[token] - at)
            next_job.append(next_at - returned[token])
            if next_token in taken and next_token in committed:
                came, took = taken[next_token]
                ready = committed[next_token]
                waiting.append(max(ready - came, 0.0))
                woken.append(max(took - max(came, ready), 0.0))

    def mean_ms(values: list[float]) -> float:
        return statistics.fmean(values) * 1000 if values else 0.0

    result = {
        "jobs": jobs,
        "concurrency": concurrency,
        "jobs_per_s": jobs / span,
        "handler_ms": mean_ms(handler),
        "next_job_ms": mean_ms(next_job),
        "waiting_for_claim_ms": mean_ms(waiting),
        "woken_ms": mean_ms(woken),
        "settle_ms": mean_ms([seconds for seconds, _ in statements]),
        "settles": len(statements),
        "jobs_per_settle": (statistics.fmean([n for _, n in statements]) if statements else 0.0),
        "wal_sync_ms": wal["sync_ms"] / wal["syncs"] if wal["syncs"] else 0.0,
    }
    if "statement" in server:  # the server's own time in the statement, without the commit
        result["settle_server_ms"] = server["statement"]["mean_exec_ms"]
    ledon.reset()
    log("  slot profile: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()))
    return result
