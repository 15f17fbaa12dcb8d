"""The benchmark run: every system on the same server, one after the other; each
measurement repeated and reported as the median. What each measurement is and how it
is taken: ``benchmarks/README.md``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import physical
from .systems import OURS, System, WorkerConfig, adapter

Log = Callable[[str], None]
Processes = list[subprocess.Popen[bytes]]

#: The fields of :class:`Plan` that count jobs (``--jobs-factor`` scales them).
_JOB_COUNTS = (
    "each_jobs", "bulk_jobs", "burn_jobs", "latency_samples", "claim_burn_jobs",
    "outbox_messages", "saga_instances", "floor_jobs", "scale_jobs", "sleep_jobs",
    "cpu_jobs", "profile_jobs", "flow_burn_jobs", "order_per_key",
)  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """How much of everything one run measures: ``Plan()`` is the full run."""

    runs: int = 3
    #: Jobs by system (``default``: every other): the slow systems get fewer, so that
    #: the whole run stays short; jobs/s are rates, comparable across counts.
    each_jobs: dict[str, int] = field(
        default_factory=lambda: {
            "default": 10_000,
            "procrastinate": 5_000,
            "django-tasks-db": 5_000,
        }
    )
    bulk_jobs: int = 10_000
    burn_jobs: dict[str, int] = field(
        default_factory=lambda: {
            "default": 10_000,
            "procrastinate": 2_000,
            "django-tasks-db": 1_000,
        }
    )
    configs: tuple[WorkerConfig, ...] = (
        WorkerConfig(1, 1),
        WorkerConfig(1, 4),
        WorkerConfig(1, 16),
        WorkerConfig(2, 16),
    )
    latency_samples: int = 200
    finished_rows: int = 1_000_000
    claim_samples: int = 500
    claim_batches: int = 100
    claim_burn_jobs: int = 10_000
    outbox_messages: int = 10_000
    #: Ordered outbox delivery (benchmarks/outbox_order.py): keys x messages per key
    #: through this many dispatchers, 5 % of publishes failing.
    order_keys: int = 100
    order_per_key: int = 1_000
    order_dispatchers: int = 4
    saga_instances: int = 200
    flow_burn_jobs: int = 10_000
    floor_jobs: int = 5_000
    commit_seconds: float = 5.0
    commit_clients: tuple[int, ...] = (1, 4)
    #: Worker processes of the scale-out curve, each at ``scale_concurrency``.
    scale_processes: tuple[int, ...] = (1, 2, 4, 8)
    scale_concurrency: int = 8
    scale_jobs: int = 10_000
    #: Jobs of the 5 ms handler (at most each system's ``burn_jobs``), run by one
    #: process at ``sleep_concurrency``.
    sleep_jobs: int = 5_000
    sleep_concurrency: int = 16
    #: Jobs of the CPU-bound handler (ours), by one process at ``cpu_concurrency`` and
    #: by ``run_jobs --processes`` with as many processes, one thread each.
    cpu_jobs: int = 1_000
    cpu_concurrency: int = 2
    #: Queue depths of the claim cost with queued jobs: shallow, deep.
    queued_rows: tuple[int, int] = (1_000, 1_000_000)
    #: Claims between the cold and the steady phase of the deep-queue claim cost.
    queued_warm: int = 20_000
    #: Jobs of each run of :mod:`benchmarks.profiling`.
    profile_jobs: int = 3_000
    #: ``--setups``: only the burn-downs of one process at these (handler kind,
    #: concurrency), at default settings; None: every burn-down.
    setups: frozenset[tuple[str, int]] | None = None

    def wants(self, kind: str, config: WorkerConfig, settings: dict[str, Any]) -> bool:
        """Whether the burn-down of ``kind`` at ``config`` with our ``settings`` added
        is measured (``--setups``)."""
        if self.setups is None:
            return True
        return not settings and config.processes == 1 and (kind, config.concurrency) in self.setups

    @classmethod
    def quick(cls) -> Plan:
        """A smoke run: one run of tiny counts."""
        return cls(
            runs=1,
            each_jobs={"default": 100},
            bulk_jobs=200,
            burn_jobs={"default": 200},
            configs=(WorkerConfig(1, 1), WorkerConfig(1, 4)),
            latency_samples=5,
            finished_rows=2_000,
            claim_samples=20,
            claim_batches=5,
            claim_burn_jobs=0,
            outbox_messages=100,
            order_keys=10,
            order_per_key=20,
            saga_instances=5,
            flow_burn_jobs=1_000,
            floor_jobs=100,
            commit_seconds=1.0,
            scale_processes=(1, 2),
            scale_concurrency=2,
            scale_jobs=100,
            sleep_jobs=64,
            sleep_concurrency=4,
            cpu_jobs=20,
            queued_rows=(100, 2_000),
            queued_warm=200,
            profile_jobs=100,
        )

    def scaled(self, factor: float) -> Plan:
        """The same plan with ``factor`` times the jobs of every measurement that
        counts jobs (rates do not depend on the count, only their precision does);
        the table sizes of the claim costs stay."""

        def n(count: int) -> int:
            return max(int(count * factor), 10) if count else 0

        def scale(value: Any) -> Any:
            return {k: n(v) for k, v in value.items()} if isinstance(value, dict) else n(value)

        if factor == 1:
            return self
        return replace(self, **{name: scale(getattr(self, name)) for name in _JOB_COUNTS})

    def for_system(self, counts: dict[str, int], system: str) -> int:
        return counts.get(system, counts["default"])

    def sleep_jobs_of(self, system: str) -> int:
        """Jobs of the 5 ms handler's burn-down of ``system``."""
        return min(self.sleep_jobs, self.for_system(self.burn_jobs, system))

    def burn_setups(self) -> list[WorkerConfig]:
        """Every burn-down set-up a system is asked for: the plan's and the 5 ms one's."""
        return list(dict.fromkeys([*self.configs, WorkerConfig(1, self.sleep_concurrency)]))


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def median_fields(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each numeric field over runs; other fields as in the last run."""
    merged: dict[str, Any] = {}
    for name in runs[-1]:
        values = [r[name] for r in runs if isinstance(r.get(name), int | float)]
        merged[name] = median(values) if values else runs[-1][name]
    merged["runs"] = len(runs)
    return merged


def rotated(items: list[Any], run: int) -> list[Any]:
    """``items`` starting at the run's turn, so that no item always goes first or last."""
    return items[run % len(items) :] + items[: run % len(items)]


def wait_for(condition: Callable[[], bool], timeout: float, what: str, poll: float) -> None:
    """Poll ``condition`` every ``poll`` seconds until it holds (an end is observed,
    not awaited); TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def _load() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


# --------------------------------------------------------------------------- workers


@contextmanager
def run_processes(
    argv: list[str], env: dict[str, str], logs: list[Path], cwd: Path | None = None
) -> Iterator[Processes]:
    """One process of ``argv`` per log file in ``logs`` (its output added there), each
    in a session of its own; at the end SIGTERM, then SIGKILL to the session of any
    still running 30 s later."""
    procs: Processes = []
    with ExitStack() as files:
        try:
            for log in logs:
                out = files.enter_context(open(log, "ab"))
                popen = subprocess.Popen(
                    argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True,
                )  # fmt: skip
                procs.append(popen)
            yield procs
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 30
            for proc in procs:
                try:
                    proc.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@contextmanager
def workers(
    system: System,
    config: WorkerConfig,
    log_dir: Path,
    tag: str,
    extra_env: dict[str, str] | None = None,
    supervised: bool = False,
) -> Iterator[Processes]:
    """Run ``config.processes`` worker processes of ``system`` (``supervised``: one
    ``run_jobs --processes`` of that many, django-ledon only); stop them at the end."""
    if supervised:
        argv = system.worker_command(config.concurrency, processes=config.processes)  # type: ignore[call-arg]
    else:
        argv = system.worker_command(config.concurrency)
    tag = re.sub(r"[^\w.-]+", "-", tag)
    logs = [log_dir / f"{tag}-{n}.log" for n in range(1 if supervised else config.processes)]
    with run_processes(argv, {**system.worker_env(), **(extra_env or {})}, logs) as procs:
        yield procs
        if any(proc.poll() is not None for proc in procs):
            raise RuntimeError(f"{system.name} worker exited early (see {log_dir})")


def burn(
    system: System,
    running: AbstractContextManager[Processes],
    count: int,
    kind: str = "noop",
    measure: Callable[[Processes], AbstractContextManager[Any]] = lambda _: nullcontext(),
) -> float:
    """Jobs/s of ``count`` jobs of the ``kind`` handler queued at one commit into the
    workers ``running`` starts, once they have run a warm-up job: from the first job's
    start (the commit where the system records no start time) to the last job's end.
    ``measure(processes)`` is entered around the seed and the wait."""
    with running as procs:
        system.seed(1)
        system.wait_until_done(timeout=60, poll=0.02)
        with measure(procs):
            before = time.time()
            system.seed(count, kind)
            committed = time.time()
            end = system.wait_until_done(timeout=max(120.0, count / 10))
        first = system.first_started_since(before)
    return count / (end - (first if first is not None else committed))


class Starts:
    """The handlers' start reports (:mod:`benchmarks.probe`), marker -> epoch seconds,
    received over UDP on the loopback interface by a thread while the block runs;
    ``env`` tells the workers where to send them."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.env = {"BENCH_PROBE_PORT": str(self.sock.getsockname()[1])}
        self.seen: dict[int, float] = {}
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._receive, name="bench-starts", daemon=True)

    def __enter__(self) -> Starts:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed.set()
        self.thread.join(5)
        self.sock.close()

    def _receive(self) -> None:
        while not self.closed.is_set():
            try:
                marker, at = self.sock.recv(256).decode().split()
            except TimeoutError:
                continue
            except OSError:
                return
            self.seen.setdefault(int(marker), float(at))

    def wait(self, marker: int, timeout: float) -> float:
        """The start of the job ``marker``, once reported."""
        wait_for(lambda: marker in self.seen, timeout, f"job {marker} to start", poll=0.001)
        return self.seen[marker]


# --------------------------------------------------------------------------- measurements


class Recorder:
    """Figures by system and key, one a run, logged as they come."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.raw: dict[str, dict[str, list[float]]] = {}
        self.jobs: dict[tuple[str, str], int] = {}

    def __call__(
        self, system: System, key: str, value: float, jobs: int = 0, unit: str = "jobs/s"
    ) -> float:
        self.raw.setdefault(system.name, {}).setdefault(key, []).append(value)
        self.jobs[(system.name, key)] = jobs
        self.log(f"  {system.name:16} {key:22} {value:10.1f} {unit}")
        return value

    def medians(self) -> dict[str, dict[str, float]]:
        return {name: {k: median(v) for k, v in keys.items()} for name, keys in self.raw.items()}


def _variant(settings: dict[str, Any]) -> str:
    """A set-up's name suffix for our added ``JOBS`` settings: ``-prefetch0``."""
    return "".join(f"-{k.lower()}{v}" for k, v in settings.items() if k != "QUEUES")


class Runner:
    def __init__(
        self,
        plan: Plan,
        systems: list[System],
        admin: Callable[[str], None],
        log_dir: Path,
        log: Log,
        database_url: str = "",
    ) -> None:
        self.plan, self.systems, self.admin, self.log = plan, systems, admin, log
        self.log_dir = log_dir
        self.record = Recorder(log)
        self.database_url = database_url
        self.statements = bool(database_url) and physical.statements_available(database_url)
        #: Per-job costs of each burn-down: system -> set-up key -> one dict a run.
        self.costs: dict[str, dict[str, list[dict[str, Any]]]] = {}
        #: Lock waits sampled during the scale-out curve: set-up key -> one dict a run.
        self.locks: dict[str, list[dict[str, Any]]] = {}
        self.burns = 0
        #: The per-job costs of the last burn-down recorded.
        self.last_cost: dict[str, Any] = {}

    def fresh(self, system: System, prime: int = 0, kind: str = "noop") -> dict[str, Any]:
        """Empty the system's tables; with ``prime``, first let the planner see
        ``prime`` queued jobs of the ``kind`` handler (ANALYZE), so that every system's
        claim queries are planned for a full queue, as a long-running server's
        statistics would allow. Returns the WAL those jobs' enqueue wrote."""
        seed: dict[str, Any] = {"wal_bytes": 0}
        system.reset()
        if prime:
            self.admin("CHECKPOINT")
            # One job first, uncounted, as a burn-down's warm-up job is: the first
            # change of each page after a checkpoint writes the whole page, and the
            # seed measured here must not count pages the burn-down's does not.
            system.seed(1, kind)
            with physical.counting(system.database_url, False, seed):
                system.seed(prime, kind)
            system.analyze(self.admin)
            system.reset()
        # Start every measurement from a clean WAL so a checkpoint never lands inside it.
        self.admin("CHECKPOINT")
        return seed

    def enqueue(self, system: System, bulk: bool = False) -> float:
        """Jobs/s of the one-by-one enqueue, or with ``bulk`` of the bulk one."""
        plan = self.plan
        count = plan.bulk_jobs if bulk else plan.for_system(plan.each_jobs, system.name)
        self.fresh(system)
        start = time.perf_counter()
        (system.enqueue_bulk if bulk else system.enqueue_each)(count)
        return count / (time.perf_counter() - start)

    def burn_down(
        self,
        system: System,
        config: WorkerConfig,
        count: int,
        *,
        kind: str = "noop",
        settings: dict[str, Any] | None = None,
        locks: dict[str, Any] | None = None,
        variant: str | None = "",
        supervised: bool = False,
    ) -> float:
        """Jobs/s of :func:`burn` with the planner primed (see :meth:`fresh`);
        ``settings`` are added to our workers' ``JOBS``; ``supervised``: the workers
        under one ``run_jobs --processes``.

        Also records per job under the set-up's key, followed by ``/variant`` if one is
        given (None: not recorded), the WAL written (less the seed's, measured alone),
        the statements the system's processes sent (with ``pg_stat_statements``; the
        harness's polls left out), the machine's CPUs busy and the workers' own CPU
        time; and, with ``locks``, the lock waits sampled meanwhile."""
        seed = self.fresh(system, count, kind)
        cost: dict[str, Any] = {}

        def measure(procs: Processes) -> ExitStack:
            stack = ExitStack()
            stack.enter_context(physical.counting(system.database_url, self.statements, cost))
            stack.enter_context(physical.cpu_use([p.pid for p in procs], cost))
            if locks is not None:
                stack.enter_context(physical.sampling_locks(self.database_url, locks))
            return stack

        self.burns += 1
        tag = f"{self.burns:03d}-{system.name}-{kind}{_variant(settings or {})}-{config.key}"
        env = {"BENCH_JOBS": json.dumps(settings)} if settings else None
        running = workers(system, config, self.log_dir, tag, env, supervised)
        rate = burn(system, running, count, kind, measure)
        if variant is None:
            return rate
        cost["wal_bytes"] -= seed["wal_bytes"]
        entry = {"jobs": count, **physical.per_job(cost, count)}
        self.last_cost = entry
        key = system.worker_config(config).key + (f"/{variant}" if variant else "")
        self.costs.setdefault(system.name, {}).setdefault(key, []).append(entry)
        return rate

    def sleep5(
        self, system: System, concurrency: int, settings: dict[str, Any], kind: str = "sleep5"
    ) -> float:
        """The 5 ms handler's burn-down by one process at ``concurrency``, with
        ``settings`` added to our workers' ``JOBS``; ``kind`` ``sleep5async``: our
        handler is an ``async def`` (the peers' always are)."""
        config = system.worker_config(WorkerConfig(1, concurrency))
        jobs = self.plan.sleep_jobs_of(system.name)
        variant = kind + _variant(settings)
        return self.burn_down(system, config, jobs, kind=kind, settings=settings, variant=variant)

    def latency(self, system: System) -> dict[str, Any]:
        """Enqueue one job at a time into an idle worker; the handler reports its
        start time over UDP (loopback). Timed from the start of the enqueue call,
        its insert and commit included: a worker may start the job before the call
        has returned (the commit is visible before the client goes on), so the
        call's return would be an instant after the pickup, and a sample negative."""
        self.fresh(system)
        values: list[float] = []
        config = system.worker_config(WorkerConfig(1, 1))
        tag = f"{system.name}-latency"
        with Starts() as starts, workers(system, config, self.log_dir, tag, starts.env):
            system.enqueue_marked(-1)
            starts.wait(-1, 60)
            for marker in range(self.plan.latency_samples):
                time.sleep(0.05)  # let the worker finish and fall idle
                called = time.time()
                system.enqueue_marked(marker)
                values.append((starts.wait(marker, 10) - called) * 1000)
        return {
            "samples": len(values),
            "p50_ms": percentile(values, 0.50),
            "p99_ms": percentile(values, 0.99),
            "mean_ms": statistics.fmean(values),
            "values_ms": [round(v, 3) for v in values],
        }

    # ------------------------------------------------------------------ the run

    def ours_physical(self, system: System, run: int) -> None:
        """The measurements of django-ledon alone, in each run right after its
        burn-downs: the floor and the commit rates (the limits its concurrency-1
        rate is read against), the scale-out curve, the CPU-bound handler and the
        asynchronous commit."""
        plan, record = self.plan, self.record
        self.fresh(system, prime=plan.floor_jobs)
        system.seed(plan.floor_jobs)
        floor = physical.floor_loop(self.database_url, plan.floor_jobs)
        record(system, "floor", floor["jobs_per_s"], plan.floor_jobs)
        for clients in plan.commit_clients:
            self.admin("CHECKPOINT")
            rate = physical.commit_rate(self.database_url, clients, plan.commit_seconds)
            record(system, f"commit_{clients}", rate["tps"], 0, unit="commits/s")
        for processes in plan.scale_processes:
            config = WorkerConfig(processes, plan.scale_concurrency)
            locks: dict[str, Any] = {}
            scaled = self.burn_down(system, config, plan.scale_jobs, locks=locks)
            record(system, f"scale_{config.key}", scaled, plan.scale_jobs)
            self.locks.setdefault(config.key, []).append(locks)
        self.cpu_bound(system, run)
        self.asynchronous_commit(system, run)

    def cpu_bound(self, system: System, run: int) -> None:
        """The CPU-bound handler: one process at ``cpu_concurrency`` threads, and
        ``run_jobs --processes`` of as many single-threaded workers (their order
        alternating from run to run). Threads share one interpreter lock; processes
        do not."""
        plan = self.plan
        setups = [
            (WorkerConfig(1, plan.cpu_concurrency), False),
            (WorkerConfig(plan.cpu_concurrency, 1), True),
        ]
        for config, supervised in setups if run % 2 == 0 else setups[::-1]:
            key = f"{config.processes}x-c1" if supervised else config.key
            rate = self.burn_down(
                system, config, plan.cpu_jobs, kind="cpu20", variant=None, supervised=supervised
            )
            self.record(system, f"cpu20_{key}", rate, plan.cpu_jobs)

    def asynchronous_commit(self, system: System, run: int) -> None:
        """``JOBS["ASYNCHRONOUS_COMMIT"]`` off and on, one right after the other (their
        order alternating from run to run): the burn-down at concurrency 1 and the 5 ms
        handler at ``sleep_concurrency``. The durable half measures again what the
        burn-downs before did: its per-job costs are not recorded."""
        plan, sleep = self.plan, self.plan.sleep_concurrency
        # (name, set-up, jobs, handler, the per-job costs' variant of the async half)
        burn_jobs, sleep_jobs = (
            plan.for_system(plan.burn_jobs, system.name),
            plan.sleep_jobs_of(system.name),
        )
        cases = [
            ("c1", WorkerConfig(1, 1), burn_jobs, "noop", "async"),
            (f"sleep5_c{sleep}", WorkerConfig(1, sleep), sleep_jobs, "sleep5", "sleep5-async"),
        ]
        modes = ["durable", "async"] if run % 2 == 0 else ["async", "durable"]
        for name, config, jobs, kind, async_variant in cases:
            for mode in modes:
                rate = self.burn_down(
                    system, config, jobs, kind=kind,
                    settings={"ASYNCHRONOUS_COMMIT": mode == "async"},
                    variant=async_variant if mode == "async" else None,
                )  # fmt: skip
                self.record(system, f"syncmode_{name}_{mode}", rate, jobs)

    def run(self) -> dict[str, Any]:
        plan, record = self.plan, self.record
        for run in range(plan.runs):
            self.log(f"run {run + 1} of {plan.runs}")
            for system in rotated(self.systems, run):
                each = plan.for_system(plan.each_jobs, system.name)
                record(system, "enqueue_each", self.enqueue(system), each)
                if system.has_bulk:
                    record(system, "enqueue_bulk", self.enqueue(system, bulk=True), plan.bulk_jobs)
                count = plan.for_system(plan.burn_jobs, system.name)
                for config in dict.fromkeys(system.worker_config(c) for c in plan.configs):
                    rate = self.burn_down(system, config, count)
                    record(system, f"burn_{config.key}", rate, count)
                rate = self.sleep5(system, plan.sleep_concurrency, {})
                key = system.worker_config(WorkerConfig(1, plan.sleep_concurrency)).key
                record(system, f"sleep5_{key}", rate, plan.sleep_jobs_of(system.name))
                if system.name == OURS:
                    self.ours_physical(system, run)

        results: dict[str, Any] = {}
        for system in self.systems:
            entry = results[system.name] = {
                "version": system.version(),
                "burn_configs": {c.key: system.worker_config(c).key for c in plan.burn_setups()},
            }
            for key, values in record.raw.get(system.name, {}).items():
                jobs = record.jobs[(system.name, key)]
                entry[key] = {"jobs": jobs, "runs": values, "median": median(values)}
            costs = self.costs.get(system.name, {})
            entry["per_job"] = {key: median_fields(runs) for key, runs in costs.items()}
        if OURS in results:
            locks = {key: median_fields(runs) for key, runs in self.locks.items()}
            results[OURS]["locks_during_scale"] = locks
        for system in self.systems:
            self.log(f"latency {system.name}")
            latency = results[system.name]["latency"] = self.latency(system)
            self.log(f"  p50 {latency['p50_ms']:.2f} ms, p99 {latency['p99_ms']:.2f} ms")
        return results


# --------------------------------------------------------------------------- claim cost


def _claims(runner: Runner, into: list[Any]) -> dict[str, Any]:
    """``plan.claim_samples`` claims of 1 due job, then ``plan.claim_batches`` claims
    of 16, each timed; every claim must get what it asks for and is added to ``into``.
    The client's median ms per claim of each size and, from the server, the WAL bytes
    and (with ``pg_stat_statements``) the execution ms per claimed job."""
    from jobs import execution

    plan = runner.plan
    times: dict[int, list[float]] = {1: [], 16: []}
    server: dict[str, Any] = {}
    with physical.counting(runner.database_url, runner.statements, server):
        for limit, count in ((1, plan.claim_samples), (16, plan.claim_batches)):
            for _ in range(count):
                start = time.perf_counter()
                claims = execution.claim_due("claim-cost", limit=limit)
                times[limit].append((time.perf_counter() - start) * 1000)
                assert len(claims) == limit, (len(claims), limit)
                into.extend(claims)
    taken = plan.claim_samples + plan.claim_batches * 16
    result = {f"claim_{n}_ms": median(values) for n, values in times.items()}
    result["wal_bytes_per_job"] = server["wal_bytes"] / taken
    if "execution_ms" in server:
        result["server_ms_per_job"] = server["execution_ms"] / taken
    return result


def _complete(claimed: list[Any]) -> None:
    """Finish the ``claimed`` jobs, 500 a statement."""
    from jobs import execution

    for start in range(0, len(claimed), 500):
        execution.complete_many([(c, None) for c in claimed[start : start + 500]])


def _ratios(low: dict[str, Any], high: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """``high`` over ``low`` of the claims of 1 and of 16 (``ratio_claim_1``, ...)."""
    return {
        f"{prefix}ratio_claim_{n}": high[f"claim_{n}_ms"] / low[f"claim_{n}_ms"] for n in (1, 16)
    }


def _candidate_scan() -> dict[str, Any]:
    """How the server finds the next 16 due jobs: ``EXPLAIN ANALYZE`` of the claim's
    candidate query, its execution time and its scans."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM jobs_job"
            " WHERE status = 'queued' AND NOT cancel_requested AND next_run_at <= now()"
            " AND attempt_count < max_attempts ORDER BY priority DESC, next_run_at, id"
            " LIMIT 16 FOR UPDATE SKIP LOCKED"
        )
        plan = cursor.fetchone()[0][0]

    def scans(node: dict[str, Any]) -> list[dict[str, Any]]:
        found = []
        if "Scan" in node.get("Node Type", ""):
            names = ("Node Type", "Index Name", "Actual Rows", "Shared Hit Blocks")
            keys = ("node", "index", "rows", "shared_hit_blocks")
            found.append({key: node.get(name) for key, name in zip(keys, names, strict=True)})
        return found + [scan for child in node.get("Plans", []) for scan in scans(child)]

    return {"execution_ms": plan.get("Execution Time"), "scans": scans(plan["Plan"])}


def claim_cost(runner: Runner, ledon: System) -> dict[str, Any]:
    """Claim cost of our store with ``finished_rows`` finished jobs in the table
    versus an empty table: single claims, claims of 16, and a burn-down."""
    plan = runner.plan

    def measure(label: str) -> dict[str, Any]:
        ledon.seed(plan.claim_samples + plan.claim_batches * 16)
        for sql in ("VACUUM ANALYZE jobs_job", "VACUUM ANALYZE jobs_jobattempt", "CHECKPOINT"):
            runner.admin(sql)
        claimed: list[Any] = []
        result = _claims(runner, claimed)
        # Finish what was claimed, so that no attempt is left Running (and the
        # history grows by these jobs, as it would).
        _complete(claimed)
        result["candidate_scan"] = _candidate_scan()
        if plan.claim_burn_jobs:
            # Burn-down on top of the same table (the previous claims stay Running).
            running = workers(ledon, WorkerConfig(1, 16), runner.log_dir, "claim-cost-burn")
            result["burn_down_1p_c16"] = burn(ledon, running, plan.claim_burn_jobs)
        runner.log(f"  claim cost {label}: {result}")
        return result

    ledon.reset()
    empty = measure("empty table")
    ledon.reset()
    runner.log(f"  loading {plan.finished_rows:,} finished jobs")
    load_jobs(plan.finished_rows, "succeeded")
    loaded = measure(f"{plan.finished_rows:,} finished jobs")
    ledon.reset()
    return {
        "finished_rows": plan.finished_rows,
        "empty": empty,
        "loaded": loaded,
        **_ratios(empty, loaded),
    }


def queued_claim_cost(runner: Runner, ledon: System) -> dict[str, Any]:
    """Claim cost with a shallow and a deep queue of due jobs (``plan.queued_rows``),
    each depth loaded straight into the table (plus the jobs the claims take, so that
    the depth stays), in two phases:

    - **cold**: the first claims after a ``CHECKPOINT``. Each claim's update is not
      HOT (status and token are indexed), so it adds an entry to every index; the
      first change of an index page after a checkpoint writes the whole page to the
      WAL (``full_page_writes``);
    - **steady**: the same claims after ``plan.queued_warm`` more claims since that
      checkpoint, as on a server that has been claiming for a while.

    Each phase gives the client's median time per claim, and from the server the WAL
    bytes and the execution time per claimed job."""
    from jobs import execution

    plan = runner.plan
    taken = plan.claim_samples + plan.claim_batches * 16
    depths: list[dict[str, Any]] = []
    for depth in plan.queued_rows:
        ledon.reset()
        runner.log(f"  loading {depth:,} queued jobs")
        load_jobs(depth + 2 * taken + plan.queued_warm, "queued")
        runner.admin("VACUUM ANALYZE jobs_job")
        runner.admin("CHECKPOINT")
        claimed: list[Any] = []
        cold = _claims(runner, claimed)
        for _ in range(plan.queued_warm // 100):
            claimed.extend(execution.claim_due("claim-cost", limit=100))
        steady = _claims(runner, claimed)
        assert len(claimed) == 2 * taken + plan.queued_warm // 100 * 100, len(claimed)
        _complete(claimed)
        depths.append({**cold, "steady": steady})
        runner.log(f"  claim cost, {depth:,} queued: {depths[-1]}")
    ledon.reset()
    shallow, deep = depths
    return {
        "shallow_rows": plan.queued_rows[0],
        "deep_rows": plan.queued_rows[1],
        "warm_claims": plan.queued_warm,
        "shallow": shallow,
        "deep": deep,
        **_ratios(shallow, deep),
        **_ratios(shallow["steady"], deep["steady"], "steady_"),
    }


#: The columns a fixture writes into ``jobs_job`` straight, in the order it gives them.
JOB_COLUMNS = (
    "scope_hash, job_id, handler, handler_version, payload_json, queue, priority,"
    " max_attempts, initial_not_before, next_run_at, status, attempt_count, current_token,"
    " cancel_requested, progress, progress_message, error, result_ref, leased_by,"
    " lease_expires_at, created_at, updated_at, started_at, finished_at"
)


def load_jobs(rows: int, status: str) -> None:
    """Bulk-load ``rows`` jobs straight into the table (a fixture), in claim order:
    ``queued`` ones due (a backlog), or ``succeeded`` ones, each with its attempt (the
    history a busy system accumulates)."""
    from django.db import connection

    ended = "NULL, NULL"
    if status == "succeeded":
        ended = "now() - interval '1 day', now() - interval '1 day' + g * interval '1 ms'"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO jobs_job ({JOB_COLUMNS})"
            " SELECT encode(sha256(('tenant-' || (g %% 1000))::bytea), 'hex'),"
            f" '{status}-' || g, 'bench.noop', 1, '{{\"n\":0}}', 'default', 0, 1, NULL,"
            f" now() - interval '1 day' + g * interval '1 ms', '{status}',"
            f" {int(status == 'succeeded')}, NULL, false, NULL, '', '', NULL, '', NULL,"
            f" now() - interval '1 day', now() - interval '1 day', {ended}"
            " FROM generate_series(1, %s) AS g",
            [rows],
        )
        if status == "succeeded":
            cursor.execute(
                "INSERT INTO jobs_jobattempt (job_id, number, token, status, worker_id,"
                " progress, progress_message, error, result_ref, started_at, finished_at)"
                " SELECT id, 1, md5(id::text), 'succeeded', 'history', NULL, '', '', NULL,"
                " started_at, finished_at FROM jobs_job WHERE status = 'succeeded'"
            )


# --------------------------------------------------------------------------- parts alone

#: The queue limits of each flow-control burn-down (``JOBS["QUEUES"]`` of the
#: workers), over no-op jobs spread over 64 limit keys. None binds at concurrency 16
#: in one process: they measure what keeping limits costs, not what limiting does.
#: ``every_limit``: every limit a queue takes, each rate with a burst.
FLOW_VARIANTS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "max_running": {"default": {"max_running": 64}},
    "all_three": {
        "default": {"max_running": 64, "max_running_per_scope": 64, "rate": [1_000_000, 1]}
    },
    "every_limit": {
        "default": {
            "max_running": 64,
            "max_running_per_scope": 64,
            "max_running_per_key": 64,
            "rate": [1_000_000, 1, 1_000_000],
            "rate_per_key": [1_000_000, 1, 1_000_000],
        }
    },
}


def flow_control(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """Burn-down of ``flow_burn_jobs`` by one worker process at concurrency 16 with
    each of :data:`FLOW_VARIANTS`, order rotated per run; the medians and each
    variant's slowdown (off ÷ on jobs/s)."""
    (ledon,), plan = chosen, runner.plan
    raw: dict[str, list[float]] = {name: [] for name in FLOW_VARIANTS}
    for run in range(plan.runs):
        for name in rotated(list(FLOW_VARIANTS), run):
            limits = FLOW_VARIANTS[name]
            rate = runner.burn_down(
                ledon, WorkerConfig(1, 16), plan.flow_burn_jobs, kind="keyed",
                settings={"QUEUES": limits} if limits else None, variant=f"limits-{name}",
            )  # fmt: skip
            raw[name].append(rate)
            runner.log(f"  limits {name:12} {rate:10.1f} jobs/s")
    medians = {name: median(values) for name, values in raw.items()}
    return {
        "jobs": plan.flow_burn_jobs,
        "limits": FLOW_VARIANTS,
        "runs": raw,
        "median": medians,
        "slowdown": {name: medians["off"] / medians[name] for name in raw if name != "off"},
    }


def cpu_alone(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """:meth:`Runner.cpu_bound` over the plan's runs: the medians by set-up."""
    (ours,) = chosen
    for run in range(runner.plan.runs):
        runner.cpu_bound(ours, run)
    medians = runner.record.medians()[OURS]
    return {
        "jobs": runner.plan.cpu_jobs,
        "runs": runner.record.raw[OURS],
        "median": {k: {"median": m} for k, m in medians.items()},
    }


#: The burn-downs of ``--only burn-down``: (handler, worker processes, concurrency, our
#: ``JOBS`` settings added — those set-ups only for ours).
ALONE_BURNS: tuple[tuple[str, int, int, dict[str, Any]], ...] = (
    ("noop", 1, 4, {}),
    ("noop", 1, 4, {"PREFETCH": 0}),
    ("noop", 1, 16, {}),
    ("noop", 1, 16, {"PREFETCH": 0}),
    ("noop", 1, 16, {"CLAIM_BATCH_SIZE": 16}),
    ("noop", 2, 16, {}),
    ("sleep5", 1, 16, {}),
    ("sleep5", 1, 16, {"PREFETCH": 0}),
    ("sleep5", 1, 64, {}),
    ("sleep5async", 1, 64, {}),
)


def burn_down_alone(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """The burn-downs of :data:`ALONE_BURNS`, the systems interleaved round by round:
    medians, ours over each other system's, the 5 ms handler's share of the ideal
    rate at each concurrency, and each set-up's costs per job (the workers' CPU, during
    the burn-down and since they started; statements; WAL)."""
    plan = runner.plan
    costs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in range(plan.runs):
        runner.log(f"run {run + 1} of {plan.runs}")
        for system in rotated(chosen, run):
            count = plan.for_system(plan.burn_jobs, system.name)
            for kind, processes, concurrency, extra in ALONE_BURNS:
                if extra and system.name != OURS:
                    continue
                if not plan.wants(kind, WorkerConfig(processes, concurrency), extra):
                    continue
                if kind in ("sleep5", "sleep5async"):
                    rate = runner.sleep5(system, concurrency, extra, kind)
                    key = f"{kind}-c{concurrency}{_variant(extra)}"
                else:
                    config = system.worker_config(WorkerConfig(processes, concurrency))
                    variant = _variant(extra).lstrip("-")
                    rate = runner.burn_down(system, config, count, settings=extra, variant=variant)
                    key = f"{processes}x{concurrency}{_variant(extra)}"
                runner.record(system, key, rate)
                costs.setdefault(system.name, {}).setdefault(key, []).append(runner.last_cost)
    medians = runner.record.medians()
    ours = medians.get(OURS, {})
    return {
        "runs": runner.record.raw,
        "median": medians,
        "per_job": {
            name: {key: median_fields(runs) for key, runs in keys.items()}
            for name, keys in costs.items()
        },
        "ours_over": {
            name: {k: ours[k] / v for k, v in values.items() if k in ours and v}
            for name, values in medians.items()
            if name != OURS
        },
        "sleep5_of_ideal": {
            key: rate / (int(key.split("-")[1][1:]) * 200.0)
            for key, rate in ours.items()
            if key.startswith("sleep5")
        },
    }


def bulk_alone(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """The bulk enqueue of each system with a bulk API, in interleaved rounds: jobs/s,
    and per job the WAL written and, with ``pg_stat_statements``, the statements sent
    and the server's time executing them (µs; the rest of a job's time is the
    client's, the round trip and the commit)."""
    plan, count = runner.plan, runner.plan.bulk_jobs
    costs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in chosen}
    for run in range(plan.runs):
        runner.log(f"bulk run {run + 1} of {plan.runs}")
        for system in rotated(chosen, run):
            cost: dict[str, Any] = {}
            runner.fresh(system)  # its TRUNCATE and CHECKPOINT are not the system's
            with physical.counting(runner.database_url, runner.statements, cost):
                start = time.perf_counter()
                system.enqueue_bulk(count)
                rate = count / (time.perf_counter() - start)
            costs[system.name].append(physical.per_job(cost, count))
            runner.record(system, "bulk", rate)
    return {
        "jobs": count,
        "runs": {name: keys["bulk"] for name, keys in runner.record.raw.items()},
        "median": {name: keys["bulk"] for name, keys in runner.record.medians().items()},
        "per_job": {name: median_fields(entries) for name, entries in costs.items()},
    }


def pickup_and_enqueue(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """Every system's idle pickup latency and one-by-one enqueue (median of the runs)."""
    result: dict[str, Any] = {"latency": {}, "enqueue_each": {}}
    for system in chosen:
        runner.log(f"{system.name}: idle pickup latency, one-by-one enqueue")
        result["latency"][system.name] = runner.latency(system)
        rates = [runner.enqueue(system) for _ in range(runner.plan.runs)]
        result["enqueue_each"][system.name] = median(rates)
    return result


def profile_alone(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """Where one job's time goes and where a 5 ms handler's slot's time goes
    (:mod:`benchmarks.profiling`)."""
    from . import cpu_parts, profiling

    (ours,), plan, log = chosen, runner.plan, runner.log
    log("profile of one job")
    profile = profiling.profile(runner.database_url, ours, runner.admin, plan.profile_jobs, log=log)
    log("profile of a 5 ms handler's slot")
    slot = profiling.slot_profile(
        runner.database_url, ours, runner.admin, plan.sleep_jobs, plan.sleep_concurrency, log=log
    )
    log("the worker's CPU per job, by part")
    parts = cpu_parts.measure(ours, runner.admin, plan.profile_jobs, (4, 16), log=log)
    return {"profile": profile, "slot_profile": slot, "cpu_parts": parts}


#: Runs of ``run_jobs --burst`` on an empty queue that the start-up figure is the
#: median of.
STARTUP_RUNS = 15


def startup(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """``run_jobs --burst`` on an empty queue, :data:`STARTUP_RUNS` times (three with
    ``--quick``) after one run that is not measured: the wall time of each process
    from its start to its exit, and its CPU time (user and system)."""
    import resource

    (ours,) = chosen
    ours.reset()
    argv = [*ours.worker_command(1), "--burst"]
    env = ours.worker_env()
    # A first run, which may write the modules' bytecode: not measured.
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(STARTUP_RUNS if runner.plan.runs > 1 else 3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    runner.log(f"  start-up: {median(walls):.3f} s wall, {median(cpus):.3f} s CPU (medians)")
    return {"runs": len(walls), "wall_s": walls, "cpu_s": cpus,
            "median_wall_s": median(walls), "median_cpu_s": median(cpus)}  # fmt: skip


def fair_share(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """:func:`benchmarks.fairness.fair_share` (imported once Django is set up)."""
    from .fairness import fair_share as measure

    return measure(runner, chosen)


def outbox_alone(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """:func:`benchmarks.outbox_order.measure` (imported once Django is set up: its
    events are defined at import)."""
    from . import outbox_order

    return outbox_order.measure(runner, chosen)


def ordering(runner: Runner, chosen: list[System]) -> dict[str, Any]:
    """:func:`benchmarks.ordering.ordering` (imported once Django is set up)."""
    from .ordering import ordering as measure

    return measure(runner, chosen)


Part = Callable[[Runner, list[System]], dict[str, Any]]

#: The parts ``--only`` measures alone: name -> (the measurement, the systems it takes
#: of those asked for). ``targets`` is four of them, with the verdicts.
PARTS: dict[str, tuple[Part, Callable[[list[str]], list[str]]]] = {
    "flow-control": (flow_control, lambda names: [OURS]),
    "burn-down": (burn_down_alone, lambda names: names),
    "bulk": (bulk_alone, lambda names: [n for n in names if adapter(n).has_bulk]),
    "cpu": (cpu_alone, lambda names: [OURS]),
    "pickup-enqueue": (pickup_and_enqueue, lambda names: names),
    "profile": (profile_alone, lambda names: [OURS]),
    "fair-share": (fair_share, lambda names: [OURS]),
    "outbox": (outbox_alone, lambda names: [OURS]),
    "ordering": (ordering, lambda names: [OURS]),
    "start-up": (startup, lambda names: [OURS]),
}
#: The parts of ``targets``, by the key of its document.
TARGET_PARTS = {
    "burn": "burn-down",
    "flow": "flow-control",
    "cpu": "cpu",
    "idle": "pickup-enqueue",
    "startup": "start-up",
}


def write_part(out_dir: Path, name: str, result: dict[str, Any]) -> Path:
    """The figures of one part measured alone, as ``<name>-<time>.json`` in ``out_dir``."""
    path = out_dir / f"{name}-{_stamp()}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


@contextmanager
def _runner(
    names: list[str],
    *,
    plan: Plan,
    database_url: str,
    out_dir: Path,
    log: Log,
    admin: Callable[[str], None],
    cpu_burner: bool = False,
) -> Iterator[Runner]:
    """A runner over the systems ``names``, installed; their connections closed at the
    end. Worker logs go to ``out_dir/logs``."""
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    chosen = [adapter(name)(database_url) for name in names]
    try:
        for system in chosen:
            system.install()
        yield Runner(plan, chosen, admin, log_dir, log, database_url)
    finally:
        for system in chosen:
            system.close()


def alone(part: str, systems: list[str], **session: Any) -> dict[str, Any]:
    """Only ``part`` of :data:`PARTS` (``--only``), or ``targets``: its figures, with
    the load average at its start and end, written as JSON named after the part into
    the session's ``out_dir``."""
    if part == "targets":
        from .report import worker_targets

        result = {key: alone(name, systems, **session) for key, name in TARGET_PARTS.items()}
        result["rows"] = worker_targets(result)
    else:
        measure, take = PARTS[part]
        load = _load()
        with _runner(take(systems), **session) as runner:
            result = measure(runner, runner.systems)
        result["load_average"] = {"start": load, "end": _load()}
    result["cpu_burner"] = session.get("cpu_burner", False)
    write_part(session["out_dir"], part, result)
    return result


# --------------------------------------------------------------------------- entry


def run_all(systems: list[str], server: dict[str, str], **session: Any) -> dict[str, Any]:
    """Measure the installed of ``systems`` against the session's database (already
    migrated); return the results and write them as JSON into ``out_dir`` after every
    part, so that a failure late in the run keeps the rest."""
    from . import extras

    plan, log, admin, out_dir = (session[k] for k in ("plan", "log", "admin", "out_dir"))
    installed = [name for name in systems if adapter(name).available()]
    skipped = {
        n: "not installed (pip install -e '.[bench]')" for n in systems if n not in installed
    }
    path = out_dir / f"results-{_stamp()}.json"
    environment = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": _load(),
        "cpu_burner": session.get("cpu_burner", False),
        "postgresql": server,
    }
    document: dict[str, Any] = {}

    def save(**parts: Any) -> None:
        document.update(parts)
        for written in (path, out_dir / "latest.json"):
            written.write_text(json.dumps(document, indent=2))

    with _runner(installed, **session) as runner:
        save(
            systems=runner.run(),
            environment=environment,
            plan={**asdict(plan), "configs": [asdict(c) for c in plan.configs]},
            quick=plan.runs == 1 and plan.finished_rows < 1_000_000,
            skipped=skipped,
            statements_measured=runner.statements,
        )
        ours = next((s for s in runner.systems if s.name == OURS), None)
        if ours is not None:
            log("claim cost")
            save(claim_cost=claim_cost(runner, ours))
            log("claim cost with queued jobs")
            save(queued_claim_cost=queued_claim_cost(runner, ours))
            log("flow control (limits on versus off)")
            save(flow_control=flow_control(runner, [ours]))
            log("fair share, the noisy neighbour and the submit-time rules")
            save(fair_share=fair_share(runner, [ours]))
            log("batches and sequences")
            save(ordering=ordering(runner, [ours]))
            log("outbox dispatch, saga steps")
            save(
                outbox=extras.outbox_dispatch(plan.outbox_messages, plan.runs, admin),
                sagas=extras.saga_steps(plan.saga_instances, plan.runs, admin),
            )
            log("ordered outbox delivery")
            save(outbox_order=outbox_alone(runner, [ours]))
            environment["load_average_end"] = _load()
            save(**profile_alone(runner, [ours]))
            log("start-up of run_jobs --burst on an empty queue")
            save(startup=startup(runner, [ours]))
    log(f"raw results: {path}")
    return document
