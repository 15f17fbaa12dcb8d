"""What the server itself allows, measured in the same run as the systems, and what
the systems cost it per job: the floor loop (:func:`floor_loop`), the one-row commit
rate (:func:`commit_rate`), statements and WAL between two points (:func:`counting`),
lock waits while workers run (:class:`LockSampler`), and the CPU time of the machine
and of the workers (:func:`cpu_use`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from glob import glob
from pathlib import Path
from typing import Any

#: Statements of the harness itself (progress polls) start with this comment, so that
#: :func:`counting` leaves them out of a system's statements.
HARNESS_MARK = "/* bench-harness */"

_COMMIT_TABLE = "bench_commit_rate"


def _connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


# --------------------------------------------------------------------------- the floor


def succeeded(token: str) -> dict[str, Any]:
    """The finish of a successful attempt, as :func:`jobs.store.sql.finishing_params` takes it."""
    return {"token": token, "outcome": "succeeded", "result_ref": None, "error": "", "summary": ""}


def finish_and_claim_params(
    worker_id: str, lease_expires_at: datetime, now: datetime, limit: int, done: list[Any]
) -> dict[str, Any]:
    """The parameters of the finish-and-claim statement, finishing ``done`` (as
    :func:`succeeded` gives them) and claiming up to ``limit`` jobs, with what follows
    in batches and sequences passed as the worker's finish passes it
    (``jobs.store.finishing``): these jobs are in none."""
    from jobs.conf import jobs_settings
    from jobs.fair_share import place
    from jobs.store import sql

    return {
        "worker_id": worker_id,
        "lease_expires_at": lease_expires_at,
        "now": now,
        "limit": limit,
        **sql.finishing_params("postgresql", done),
        "now_place": place(now),
        "channel": jobs_settings().NOTIFY_CHANNEL,
        "requeue": False,
    }


def floor_loop(url: str, jobs: int) -> dict[str, Any]:
    """django-ledon's own finish-and-claim statement — the one a worker at concurrency 1
    runs once per job, built by the store's builders — run back to back from one
    connection, prepared, in autocommit, with no worker around it: each statement
    finishes the job the previous one claimed and claims the next, ``jobs`` in all.
    Its rate is the most a worker at concurrency 1 could do."""
    from jobs.store import sql

    statement = sql.claim("postgresql", queues=0, one_job=False, finishing=True)
    done: list[dict[str, Any]] = []
    claimed = 0
    with _connect(url) as conn:
        conn.prepare_threshold = 0
        cursor = conn.cursor()
        columns: dict[str, int] = {}
        start = time.perf_counter()
        while True:
            now = datetime.now(UTC)
            params = finish_and_claim_params(
                "floor", now + timedelta(seconds=300), now, 1 if claimed < jobs else 0, done
            )
            cursor.execute(statement, params, prepare=True)
            rows = cursor.fetchall()
            if not columns:
                columns = {c.name: n for n, c in enumerate(cursor.description or ())}
            kind, token = columns["kind"], columns["token"]
            done = [succeeded(row[token]) for row in rows if row[kind] == "claimed"]
            if any(row[kind] == "orphan" for row in rows):
                raise RuntimeError("the floor loop found a job without its attempt row")
            claimed += len(done)
            if not done:
                break
        elapsed = time.perf_counter() - start
    if claimed != jobs:
        raise RuntimeError(f"the floor loop claimed {claimed} of {jobs} jobs")
    # jobs + 1 statements: the last one only finishes.
    return {"jobs": jobs, "jobs_per_s": jobs / elapsed, "ms_per_job": elapsed * 1000 / jobs}


# --------------------------------------------------------------------------- commits


def commit_rate(url: str, clients: int, seconds: float) -> dict[str, Any]:
    """Durable one-row ``UPDATE`` commits per second with ``clients`` clients, each on
    its own row, by ``pgbench`` (it comes with the server's binaries)."""
    tool = shutil.which("pgbench") or max(glob("/usr/lib/postgresql/*/bin/pgbench"), default="")
    if not tool:
        raise RuntimeError("pgbench not found (on PATH or in /usr/lib/postgresql/*/bin)")
    with _connect(url) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {_COMMIT_TABLE}")
        conn.execute(f"CREATE TABLE {_COMMIT_TABLE} (id int PRIMARY KEY, n bigint NOT NULL)")
        conn.execute(
            f"INSERT INTO {_COMMIT_TABLE} SELECT g, 0 FROM generate_series(0, %s) AS g", [clients]
        )
    try:
        with tempfile.TemporaryDirectory() as directory:
            script = Path(directory) / "update.sql"
            script.write_text(f"UPDATE {_COMMIT_TABLE} SET n = n + 1 WHERE id = :client_id;\n")
            argv = [tool, "-n", "-M", "prepared", "-f", str(script), "-c", str(clients)]
            argv += ["-j", str(clients), "-T", str(max(1, round(seconds))), url]
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
    finally:
        with _connect(url) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {_COMMIT_TABLE}")
    match = re.search(r"tps = ([0-9.]+)", done.stdout)
    if match is None:
        raise RuntimeError(f"pgbench printed no tps: {done.stdout[-500:]}")
    return {"clients": clients, "tps": float(match.group(1))}


# --------------------------------------------------------------------------- counters


def statements_available(url: str) -> bool:
    """Whether ``pg_stat_statements`` is loaded (``shared_preload_libraries``); creates
    the extension in the database if so."""
    with _connect(url) as conn:
        loaded = conn.execute(
            "SELECT 'pg_stat_statements' = ANY(string_to_array(current_setting("
            "'shared_preload_libraries'), ','))"
        ).fetchone()
        if not loaded or not loaded[0]:
            return False
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        return True


@contextmanager
def counting(url: str, statements: bool, into: dict[str, Any]) -> Iterator[None]:
    """Put into ``into`` the WAL bytes the server wrote while the block ran
    (``wal_bytes``: its insert position, which counts WAL that an asynchronous
    commit has not yet written out) and, with ``statements``, the statements of the database's
    processes, leaving out the harness's own: how many, their execution time and
    the commonest (``statements``, ``execution_ms``, ``top``)."""
    with _connect(url) as conn:
        if statements:
            conn.execute("SELECT pg_stat_statements_reset()")
        lsn = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()[0]
    yield
    with _connect(url) as conn:
        wal = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s::pg_lsn)", [lsn]
        ).fetchone()[0]
        into["wal_bytes"] = int(wal)
        if not statements:
            return
        rows = conn.execute(
            "SELECT query, calls, wal_bytes, total_exec_time FROM pg_stat_statements"
            " WHERE toplevel"
            " AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND query NOT LIKE %s AND query NOT LIKE '%%pg_stat_statements%%'"
            " AND query NOT LIKE '%%pg_current_wal_insert_lsn%%'",
            [HARNESS_MARK + "%"],
        ).fetchall()
    top = [{"query": q[:160], "calls": int(c), "wal_bytes": int(w)} for q, c, w, _ in rows]
    into.update(
        statements=int(sum(row[1] for row in rows)),
        execution_ms=float(sum(row[3] for row in rows)),
        top=sorted(top, key=lambda r: -r["calls"])[:8],
    )


def per_job(cost: dict[str, Any], jobs: int) -> dict[str, Any]:
    """What :func:`counting` and :func:`cpu_use` put into ``cost``, per job where it
    is a total: WAL bytes, statements, the server's µs executing them (with the
    commonest statements), the CPUs busy, the workers' CPU ms (during the burn-down,
    and in all since they started)."""
    entry: dict[str, Any] = {"wal_bytes": cost["wal_bytes"] / jobs}
    if "statements" in cost:
        entry["statements"] = cost["statements"] / jobs
        entry["server_us"] = cost["execution_ms"] * 1000 / jobs
        entry["top"] = cost["top"]
    if "cpus_busy" in cost:
        entry.update(cpus_busy=cost["cpus_busy"], cpus=cost["cpus"])
    if "worker_cpu_s" in cost:
        entry["worker_cpu_ms"] = cost["worker_cpu_s"] * 1000 / jobs
        entry["worker_cpu_total_ms"] = cost["worker_cpu_total_s"] * 1000 / jobs
    return entry


# --------------------------------------------------------------------------- lock waits


#: What the statements a backend runs are, by how their text starts (the first match
#: names it): django-ledon's worker's statements, then any other by its first words.
_STATEMENT_KINDS = (
    ("WITH done AS", "finish and claim"),
    ("WITH claimed AS", "claim"),
    ("UPDATE jobs_job SET lease_expires_at", "lease renewal"),
)


def statement_kind(query: str) -> str:
    """A short name for the statement ``query`` (see :data:`_STATEMENT_KINDS`)."""
    text = " ".join(query.split())
    for start, kind in _STATEMENT_KINDS:
        if text.startswith(start):
            return kind
    return " ".join(text.split(" ")[:3]) or "(none)"


class LockSampler(threading.Thread):
    """Sample, every ``interval`` seconds, the backends of the database that wait on a
    lock (``pg_stat_activity.wait_event_type = 'Lock'``), the ungranted locks in
    ``pg_locks``, and for each waiting backend the statement it runs and the one
    each backend it waits for runs (``pg_blocking_pids``)."""

    def __init__(self, url: str, interval: float = 0.02) -> None:
        super().__init__(name="bench-lock-sampler", daemon=True)
        self.url = url
        self.interval = interval
        self.finished = threading.Event()
        self.samples = 0
        #: Sums over the samples: waiting backends, ungranted locks, active backends.
        self.sums: Counter[str] = Counter()
        self.most_waiting = 0
        self.events: Counter[str] = Counter()
        self.waits_for: Counter[str] = Counter()

    def run(self) -> None:
        with _connect(self.url) as conn:
            while not self.finished.is_set():
                rows = conn.execute(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchall()
                ungranted = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted"
                ).fetchone()[0]
                pairs = conn.execute(
                    "SELECT a.query, b.query FROM pg_stat_activity a"
                    " CROSS JOIN LATERAL unnest(pg_blocking_pids(a.pid)) AS blocker(pid)"
                    " JOIN pg_stat_activity b ON b.pid = blocker.pid"
                    " WHERE a.wait_event_type = 'Lock' AND a.datname = current_database()"
                ).fetchall()
                active = [(kind, event) for state, kind, event in rows if state == "active"]
                waiting = sum(1 for _, kind, _ in rows if kind == "Lock")
                self.events.update(f"{kind}:{event}" for kind, event in active if kind)
                self.waits_for.update(
                    f"{statement_kind(waiter)} ← {statement_kind(blocker or '')}"
                    for waiter, blocker in pairs
                )
                self.sums.update(waiting=waiting, ungranted=int(ungranted), active=len(active))
                self.samples += 1
                self.most_waiting = max(self.most_waiting, waiting)
                self.finished.wait(self.interval)

    def result(self) -> dict[str, Any]:
        n = max(self.samples, 1)
        return {
            "samples": self.samples,
            "mean_waiting_on_lock": self.sums["waiting"] / n,
            "most_waiting_on_lock": self.most_waiting,
            "mean_ungranted_locks": self.sums["ungranted"] / n,
            "mean_active": self.sums["active"] / n,
            "wait_events": dict(self.events.most_common(8)),
            # waiter ← blocker: the samples in which a backend running the first waited
            # for one running the second (a backend may wait for several).
            "waits_for": dict(self.waits_for.most_common(5)),
        }


@contextmanager
def sampling_locks(url: str, into: dict[str, Any]) -> Iterator[None]:
    sampler = LockSampler(url)
    sampler.start()
    try:
        yield
    finally:
        sampler.finished.set()
        sampler.join(5)
        into.update(sampler.result())


# --------------------------------------------------------------------------- CPU


def busy_cpu_seconds() -> float | None:
    """The machine's CPU time spent busy since boot, all CPUs together (user, nice,
    system, interrupts; ``/proc/stat``), or None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pids: list[int]) -> float:
    """CPU time (user and system) of the processes ``pids`` and of their descendants
    alive now (a supervisor's workers), from ``/proc/<pid>/stat`` (after the command
    name, which may hold spaces: the parent's pid is the 2nd field, utime the 12th,
    stime the 13th); 0 where there is none."""
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{entry}/stat") as stat:
                stats[int(entry)] = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError, ValueError):
            continue  # not a process, or exited meanwhile
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    total, todo = 0.0, list(pids)
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += (int(stats[pid][11]) + int(stats[pid][12])) / os.sysconf("SC_CLK_TCK")
        todo.extend(children.get(pid, []))
    return total


@contextmanager
def cpu_use(pids: list[int], into: dict[str, Any]) -> Iterator[None]:
    """Put into ``into`` how many CPUs were busy on average (``cpus_busy``, of
    ``cpus``) while the block ran — every process of the machine counts, the server's
    and the workers' alike; nothing where :func:`busy_cpu_seconds` is None — and the
    CPU seconds the worker processes ``pids`` and their descendants spent meanwhile
    (``worker_cpu_s``) and since they started (``worker_cpu_total_s``: their start-up,
    the warm-up job and the block)."""
    before, start, workers = busy_cpu_seconds(), time.monotonic(), process_cpu_seconds(pids)
    yield
    total = process_cpu_seconds(pids)
    into["worker_cpu_s"] = total - workers
    into["worker_cpu_total_s"] = total
    after, wall = busy_cpu_seconds(), time.monotonic() - start
    if before is not None and after is not None and wall > 0:
        into.update(cpus_busy=(after - before) / wall, cpus=os.cpu_count() or 1)


#: The longest a CPU burner runs, whatever happens to the run that started it.
BURNER_SECONDS = 4 * 3600


@contextmanager
def cpu_burner() -> Iterator[None]:
    """A process that keeps one CPU busy (pure Python, no I/O) while the block runs;
    it also stops by itself after :data:`BURNER_SECONDS`."""
    code = (
        "import time\n"
        f"end = time.monotonic() + {BURNER_SECONDS}\n"
        "while time.monotonic() < end:\n"
        "    sum(range(10_000))\n"
    )
    burner = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield
    finally:
        burner.terminate()
        burner.wait(30)


def log(message: str) -> None:
    """A line of the run's progress, on standard error."""
    print(message, file=sys.stderr, flush=True)
