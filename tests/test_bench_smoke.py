"""The benchmark harness runs (``--quick``) and writes well-formed results.

Nothing here asserts a speed: performance is read from ``make bench``, never from tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.db import connection

from benchmarks import report

ROOT = Path(__file__).resolve().parents[1]

# A benchmark run is a subprocess with its own 300 s limit, which says what it printed:
# the test's limit is above it, so a slow machine fails with that output, never here.
pytestmark = pytest.mark.timeout(360)


def server_url() -> str:
    """The test database's server, as a URL to its maintenance database."""
    s = connection.settings_dict
    user = quote(s["USER"] or "")
    password = f":{quote(s['PASSWORD'])}" if s["PASSWORD"] else ""
    host = s["HOST"] or "127.0.0.1"
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgres://{user}{password}@{host}{port}/postgres"


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m`` ``args`` from the repository's root; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
@pytest.mark.postgres_only
def test_quick_run_writes_results_and_a_report(tmp_path: Path) -> None:
    """On a throw-away server of its own (the harness starts one), not the suite's:
    the WAL a burn-down writes is read from the server's WAL position, which every
    database of a server moves — the other tests' writes would land in it."""
    docs = tmp_path / "benchmarks.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--systems",
            "django-ledon",
            "--out",
            str(tmp_path),
            "--docs",
            str(docs),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((tmp_path / "latest.json").read_text())
    ours = document["systems"]["django-ledon"]
    for key in (
        "enqueue_each",
        "enqueue_bulk",
        "burn_1p-c1",
        "burn_1p-c4",
        "floor",
        "commit_1",
        "commit_4",
        "scale_1p-c2",
        "scale_2p-c2",
        "sleep5_1p-c4",
        "cpu20_1p-c2",
        "cpu20_2x-c1",
    ):
        assert ours[key]["median"] > 0, key
        assert len(ours[key]["runs"]) == 1
    assert ours["floor"]["jobs"] == 100
    # Per job of every burn-down: the WAL it wrote (statements need pg_stat_statements)
    # and the CPUs busy meanwhile; the 5 ms handler's and the asynchronous commit's
    # under their own keys, not mixed into the no-op burn-downs of the same set-up.
    assert set(ours["per_job"]) == {
        "1p-c1",
        "1p-c4",
        "1p-c2",
        "2p-c2",
        "1p-c4/sleep5",
        "1p-c1/async",
        "1p-c4/sleep5-async",
    }
    assert all(cost["wal_bytes"] > 0 for cost in ours["per_job"].values())
    assert all(cost["cpus_busy"] > 0 for cost in ours["per_job"].values())
    assert {cost["cpus"] for cost in ours["per_job"].values()} == {os.cpu_count()}
    # The workers' own CPU time per job, read from /proc (every worker process). The
    # kernel counts it in ticks of 10 ms: a tiny burn-down can read 0, never less,
    # and the run as a whole is always counted.
    worker_cpu = [cost["worker_cpu_ms"] for cost in ours["per_job"].values()]
    assert all(ms >= 0 for ms in worker_cpu), worker_cpu
    assert sum(worker_cpu) > 0, worker_cpu
    if document["statements_measured"]:
        assert all(cost["statements"] > 0 for cost in ours["per_job"].values())
    locks = ours["locks_during_scale"]["2p-c2"]
    assert locks["samples"] > 0
    assert locks["mean_waiting_on_lock"] >= 0
    # Who waited for whom: "waiter ← blocker" by statement kind, counted per sample.
    assert all(" ← " in pair and n > 0 for pair, n in locks["waits_for"].items())
    queued = document["queued_claim_cost"]
    assert (queued["shallow_rows"], queued["deep_rows"]) == (100, 2_000)
    assert queued["deep"]["claim_1_ms"] > 0
    assert queued["ratio_claim_16"] > 0
    assert ours["latency"]["samples"] == len(ours["latency"]["values_ms"]) > 0
    assert document["claim_cost"]["loaded"]["claim_1_ms"] > 0
    flow = document["flow_control"]
    assert set(flow["median"]) == {"off", "max_running", "all_three", "every_limit"}
    assert all(rate > 0 for rate in flow["median"].values())
    assert set(flow["slowdown"]) == {"max_running", "all_three", "every_limit"}
    assert document["environment"]["postgresql"]["server_version"]
    markdown = docs.read_text()
    assert markdown.startswith("# Benchmark results")
    assert document["outbox"]["median"] > 0
    assert document["sagas"]["ms_per_step"] > 0
    key_cost, order = document["outbox_order"]["key_cost"], document["outbox_order"]["order"]
    assert set(key_cost["cost"]) == {"keyless", "distinct keys", "keyless, one key halted"}
    assert all(rate > 0 for rate in key_cost["median"].values())
    assert order["sent"] >= order["keys"] * order["per_key"] == 200
    assert order["violations"] == 0
    assert order["keys_in_order"] == order["keys"]
    assert set(order["median"]) == {"keyless", "keyed"}
    assert all(rate > 0 for rate in order["median"].values())
    assert order["cost"] == order["median"]["keyless"] / order["median"]["keyed"]
    assert "| Enqueue, bulk API |" in markdown
    assert "## Targets" in markdown
    for section in (
        "## The server's limits: the floor and the commit rate",
        "## Scale-out: worker processes against one server",
        "## What each job costs the server",
        "## A realistic handler",
        "## Claim cost with a deep queue",
        "## A CPU-bound handler: processes against threads",
        "## Ordered outbox delivery",
    ):
        assert section in markdown
    assert "| Concurrency 1 ≥ 0.8 of the floor loop |" in markdown
    assert "| `run_jobs --processes 2 --concurrency 1` |" in markdown
    assert "## Where one job's time goes" in markdown
    for level in ("c1", "c4"):
        part = document["profile"][level]
        assert part["wall_ms_per_job"] > 0
        assert part["statement_ms"] > 0
        assert part["settles_per_job"] > 0
        assert part["top"]
    # A 5 ms handler's slot followed to its next job, on the same thread.
    slot = document["slot_profile"]
    assert slot["handler_ms"] > 0
    assert slot["next_job_ms"] > 0
    assert slot["settles"] > 0
    assert "A slot's turn, ms: to its next job: waiting for a claim" in markdown
    assert "| max_running=64 |" in markdown
    assert "Burn-down with limits ≤ 1.3× slower than without" in markdown
    # Tables only: every line of the report is a heading, a table row, the legend of
    # the throughput table's marks, a comment or blank.
    for line in markdown.splitlines():
        assert not line or line[0] in "#|<_†", line


def synthetic(peer_factor: float) -> dict:
    """A results document as a full run writes it, with made-up numbers."""

    def measured(value: float) -> dict:
        return {"jobs": 100, "runs": [value], "median": value}

    def system(scale: float, *, bulk: bool = True) -> dict:
        entry = {
            "version": "1",
            "enqueue_each": measured(1000 * scale),
            "burn_1p-c4": measured(2000 * scale),
            "sleep5_1p-c16": measured(1000 * scale),
            "burn_configs": {"1p-c4": "1p-c4", "1p-c16": "1p-c16"},
            "latency": {"samples": 2, "p50_ms": 2 / scale, "p99_ms": 4 / scale},
        }
        if bulk:
            entry["enqueue_bulk"] = measured(30000 * scale)
        return entry

    pgqueuer = system(peer_factor)
    pgqueuer["burn_configs"] = {"1p-c4": "1p-c0", "1p-c16": "1p-c0"}
    pgqueuer["burn_1p-c0"] = pgqueuer.pop("burn_1p-c4")
    pgqueuer["sleep5_1p-c0"] = pgqueuer.pop("sleep5_1p-c16")
    return {
        "environment": {
            "date": "2026-01-01T00:00:00+00:00",
            "python": "3.13",
            "platform": "test",
            "cpus": 2,
            "postgresql": {"server_version": "15", "fsync": "on"},
        },
        "plan": {
            "runs": 1,
            "bulk_jobs": 100,
            "sleep_concurrency": 16,
            "configs": [{"processes": 1, "concurrency": 4}],
        },
        "systems": {"django-ledon": system(1.0), "pgqueuer": pgqueuer},
        "claim_cost": {
            "finished_rows": 10,
            "empty": {"claim_1_ms": 1.0, "claim_16_ms": 2.0},
            "loaded": {"claim_1_ms": 1.1, "claim_16_ms": 2.0},
            "ratio_claim_1": 1.1,
            "ratio_claim_16": 1.0,
        },
    }


def test_report_renders_ratios_and_target_verdicts() -> None:
    markdown = report.render(synthetic(peer_factor=0.5))
    assert "| Burn-down, 1 worker process, concurrency 4 | 2,000 | 1,000 ‡ | 2.0× |" in markdown
    # The 5 ms handler is a ratio against every peer too.
    row = "| Burn-down, 5 ms handler, 1 process, concurrency 16 | 1,000 | 500 ‡ | 2.0× |"
    assert row in markdown
    verdicts = {t: holds for t, _, holds in report.targets(synthetic(0.5))}
    assert verdicts["Burn-down ≥ 1.5× pgqueuer at equal resources (every set-up)"] is True
    assert verdicts["Bulk submit ≥ 20,000 jobs/s"] is True
    slower = {t: holds for t, _, holds in report.targets(synthetic(1.0))}
    assert slower["Burn-down ≥ 1.5× pgqueuer at equal resources (every set-up)"] is False


def database_url() -> str:
    """The test database itself, as a URL."""
    return server_url().rsplit("/", 1)[0] + "/" + quote(connection.settings_dict["NAME"])


def test_a_slots_turn_is_its_handler_and_its_way_to_the_next_job() -> None:
    document = synthetic(peer_factor=0.5)
    document["slot_profile"] = {
        "jobs": 2000, "concurrency": 16, "jobs_per_s": 1500.0, "handler_ms": 5.9,
        "next_job_ms": 3.0, "waiting_for_claim_ms": 2.3, "woken_ms": 0.6, "settle_ms": 19.8,
        "settles": 86, "jobs_per_settle": 34.9, "wal_sync_ms": 4.7, "settle_server_ms": 3.1,
    }  # fmt: skip
    markdown = report.render(document)
    turn = "| A slot's turn, ms: "
    waiting = "to its next job: waiting for a claim (the look-ahead ran dry) | 2.30 |"
    assert turn + waiting in markdown
    assert turn + "to its next job: the rest (its own book-keeping) | 0.10 |" in markdown
    assert turn + "**all of it** | **8.90** |" in markdown
    assert "| 34.9; 19.80; 3.10; 4.70 |" in markdown


def test_the_cpu_rows_compare_the_workers_cpu_per_job_with_pgqueuers() -> None:
    """The targets' CPU rows are "at most" rows: ours over pgqueuer's, during the
    burn-down and with start-up included."""
    cost = {"worker_cpu_ms": 0.06, "worker_cpu_total_ms": 0.12}
    peer = {"worker_cpu_ms": 0.09, "worker_cpu_total_ms": 0.10}
    document: dict[str, Any] = {
        "burn": {
            "median": {"django-ledon": {}, "pgqueuer": {}},
            "per_job": {"django-ledon": {"1x16": cost}, "pgqueuer": {"1x16": peer}},
        },
        "flow": {"median": {"off": 1.0, "every_limit": 1.0}},
        "cpu": {"median": {}},
        "idle": {"latency": {}, "enqueue_each": {}},
    }
    rows = {row["what"]: row for row in report.worker_targets(document)}
    during = rows["Worker CPU ms per job, no-op, concurrency 16, during the burn-down"]
    whole = rows["Worker CPU ms per job, no-op, concurrency 16, start-up included"]
    assert (during["ratio"], during["holds"], during["goal"]) == (pytest.approx(2 / 3), True, "≤ 1")
    assert (whole["ratio"], whole["holds"]) == (pytest.approx(1.2), False)


def test_thread_clocks_count_each_part_without_the_parts_it_calls() -> None:
    """The CPU parts: a part's time is its thread's clock inside it less the wrapped
    parts it calls (a clock the test moves by hand)."""
    from benchmarks.cpu_parts import ThreadClocks

    now = [0.0]
    clocks = ThreadClocks(clock=lambda: now[0])

    def spend(seconds: float) -> None:
        now[0] += seconds

    inner = clocks.wrap("inner", lambda: spend(5.0))
    outer = clocks.wrap("outer", lambda: (spend(1.0), inner(), spend(2.0)))
    both = clocks.wrap("whole", lambda: (outer(), inner()))
    thread = threading.Thread(target=both)
    thread.start()
    thread.join()
    assert clocks.totals() == {"inner": 10.0, "outer": 3.0, "whole": 0.0}


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_the_lock_sampler_names_who_waits_for_whom() -> None:
    """A backend blocked on a row another holds is sampled as waiting, with the
    statements of both: the waiter's and the one it waits for."""
    import psycopg

    from benchmarks import physical

    url = database_url()
    with psycopg.connect(url, autocommit=True) as setup:
        setup.execute("CREATE TABLE bench_probe_lock (id int PRIMARY KEY)")
        setup.execute("INSERT INTO bench_probe_lock VALUES (1)")
    try:
        with psycopg.connect(url) as holder, psycopg.connect(url) as waiter:
            holder.execute("UPDATE bench_probe_lock SET id = 1 WHERE id = 1")
            blocked = threading.Thread(
                target=lambda: waiter.execute("DELETE FROM bench_probe_lock WHERE id = 1")
            )
            sampler = physical.LockSampler(url, interval=0.01)
            sampler.start()
            blocked.start()
            with psycopg.connect(url, autocommit=True) as watch:
                # Until the waiter waits (no guessing how long that takes)...
                for _ in range(1000):
                    row = watch.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type"
                        " = 'Lock' AND query LIKE 'DELETE FROM bench_probe_lock%%'"
                    ).fetchone()
                    if row and row[0]:
                        break
                    watch.execute("SELECT pg_sleep(0.005)")
            # ... and the sampler has taken two samples since.
            seen = sampler.samples
            for _ in range(1000):
                if sampler.samples >= seen + 2:
                    break
                sampler.finished.wait(0.005)
            sampler.finished.set()
            sampler.join(5)
            sampled = sampler.result()
            holder.rollback()
            blocked.join(10)
            waiter.rollback()
    finally:
        with psycopg.connect(url, autocommit=True) as setup:
            setup.execute("DROP TABLE bench_probe_lock")
    assert sampled["most_waiting_on_lock"] >= 1
    pair, samples = next(iter(sampled["waits_for"].items()))
    assert pair == "DELETE FROM bench_probe_lock ← UPDATE bench_probe_lock SET"
    assert samples >= 1


def test_statement_kinds_name_the_workers_statements() -> None:
    from benchmarks import physical
    from jobs.store import sql

    settle = sql.claim("postgresql", queues=0, one_job=False, finishing=True)
    assert physical.statement_kind(settle) == "finish and claim"
    claim = sql.claim("postgresql", queues=0, one_job=False)
    assert physical.statement_kind(claim) == "claim"
    assert physical.statement_kind("  SELECT  1\n FROM x") == "SELECT 1 FROM"
    assert physical.statement_kind("") == "(none)"


def test_physical_targets_read_ratios_against_the_floor_and_the_curve() -> None:
    document = synthetic(peer_factor=0.5)
    ours = document["systems"]["django-ledon"]

    def measured(value: float) -> dict:
        return {"jobs": 100, "runs": [value], "median": value}

    ours.update(
        {
            "burn_1p-c1": measured(900.0),
            "floor": measured(1000.0),
            "commit_1": measured(2000.0),
            "scale_1p-c8": measured(5000.0),
            "scale_2p-c8": measured(6000.0),
            "scale_4p-c8": measured(5900.0),
            "sleep5_1p-c16": measured(2900.0),
        }
    )
    document["plan"]["configs"].append({"processes": 1, "concurrency": 1})
    verdicts = {t: (m, h) for t, m, h in report.targets(document)}
    assert verdicts["Concurrency 1 ≥ 0.8 of the floor loop"] == ("900 ÷ 1,000 = 0.90", True)
    assert verdicts["Concurrency 1 ≥ 0.5 of the one-row commit rate"][1] is False
    assert verdicts["Concurrency 4 ≥ 1× pgqueuer"][1] is True
    assert verdicts["Scale-out: throughput never falls as processes are added"][1] is False
    assert verdicts["5 ms handler at concurrency 16 ≥ 90% of the ideal"][1] is True
    assert "| Scale-out: throughput never falls as processes are added |" in report.render(document)


def test_the_comparison_table_gives_both_trees_and_their_ratio() -> None:
    figures = {"jobs_per_s": 2000.0, "cpu_ms_per_job": 0.5, "statements": 1.06}
    other = {"jobs_per_s": 1000.0, "cpu_ms_per_job": 1.0, "statements": None}
    compare = {
        "setups": ["1p-c4"],
        "median": {"this tree": {"1p-c4": figures}, "main (0123456789)": {"1p-c4": other}},
    }
    table = report.compare_table({"compare": compare})
    assert "| 1p-c4 | jobs/s | 2,000 | 1,000 | 2.00 |" in table
    assert "| 1p-c4 | worker CPU ms per job | 0.500 | 1.000 | 0.50 |" in table
    assert "| 1p-c4 | statements per job | 1.06 | — | — |" in table


@pytest.mark.slow
@pytest.mark.postgres_only
def test_the_observability_benchmark_runs_small(tmp_path: Path) -> None:
    out = tmp_path / "observability.json"
    done = run_module(
        "benchmarks.observability", "--database-url", server_url(), "--rows", "2000",
        "--scrapes", "3", "--jobs", "10", "--rounds", "1", "--out", str(out),
    )  # fmt: skip
    figures = json.loads(out.read_text())
    assert figures["rows"] == 2000
    assert figures["scrape"]["scrapes"] == 3
    assert {"ledon_jobs_queued", "ledon_outbox_pending", "ledon_sagas"} <= set(
        figures["scrape"]["families"]
    )
    for variant in ("off", "metrics", "tracing", "both"):
        assert figures["jobs"][variant]["jobs_per_s"] > 0
    assert figures["jobs"]["off"]["ratio"] == figures["jobs"]["off"]["cpu_ratio"] == 1.0
    sources = {"jobs", "outbox", "sagas", "workflows"}
    assert set(figures["scrape"]["median_ms_per_source"]) == sources
    assert "metrics and tracing" in done.stdout


def only_part(part: str, out: Path) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``python -m benchmarks --quick --only part`` of django-ledon; its output and
    the figures it wrote (one JSON file named after the part)."""
    done = run_module(
        "benchmarks", "--quick", "--only", part, "--systems", "django-ledon",
        "--database-url", server_url(), "--out", str(out),
    )  # fmt: skip
    (written,) = out.glob(f"{part}-*.json")
    return done, json.loads(written.read_text())


@pytest.mark.slow
@pytest.mark.postgres_only
def test_only_burn_down_measures_the_burn_downs_and_the_5ms_handler(tmp_path: Path) -> None:
    done, figures = only_part("burn-down", tmp_path)
    runs = figures["runs"]["django-ledon"]
    assert set(runs) == {
        "1x4",
        "1x4-prefetch0",
        "1x16",
        "1x16-prefetch0",
        "1x16-claim_batch_size16",
        "2x16",
        "sleep5-c16",
        "sleep5-c16-prefetch0",
        "sleep5-c64",
        "sleep5async-c64",
    }
    assert all(len(rates) == 1 and rates[0] > 0 for rates in runs.values())
    medians = figures["median"]["django-ledon"]
    assert figures["sleep5_of_ideal"]["sleep5-c16"] == medians["sleep5-c16"] / 3200
    assert figures["sleep5_of_ideal"]["sleep5-c64"] == medians["sleep5-c64"] / 12800
    # Every set-up's worker CPU per job, during the burn-down and since the start.
    costs = figures["per_job"]["django-ledon"]
    assert set(costs) == set(runs)
    for cost in costs.values():
        # /proc counts in ticks (10 ms): a quick run's burn-down may read none.
        assert 0 <= cost["worker_cpu_ms"] <= cost["worker_cpu_total_ms"]
        assert cost["worker_cpu_total_ms"] > 0
    assert set(figures["load_average"]) == {"start", "end"}
    assert json.loads(done.stdout.strip().splitlines()[-1])["median"] == figures["median"]


@pytest.mark.slow
@pytest.mark.postgres_only
def test_only_bulk_measures_the_bulk_enqueue_alone(tmp_path: Path) -> None:
    done, bulk = only_part("bulk", tmp_path)
    assert bulk["jobs"] == 200
    assert len(bulk["runs"]["django-ledon"]) == 1
    assert bulk["median"]["django-ledon"] > 0
    cost = bulk["per_job"]["django-ledon"]
    assert cost["wal_bytes"] > 0
    if "statements" in cost:
        # The whole batch is one statement.
        assert cost["statements"] * bulk["jobs"] == 1
    assert "| django-ledon |" in done.stdout
    assert not (tmp_path / "latest.json").exists()


@pytest.mark.slow
@pytest.mark.postgres_only
def test_compare_runs_the_burn_downs_of_two_trees(tmp_path: Path) -> None:
    """``--compare HEAD --only burn-down``: this tree and its own last commit, each on
    a database of its own, both measured with CPU time; the worktree is gone after."""
    done = run_module(
        "benchmarks", "--quick", "--compare", "HEAD", "--only", "burn-down",
        "--database-url", server_url(), "--out", str(tmp_path),
    )  # fmt: skip
    (written,) = tmp_path.glob("compare-*.json")
    figures = json.loads(written.read_text())
    setups = ["1p-c4", "1p-c16", "1p-c16/sleep5", "1p-c64/sleep5", "1p-c64/sleep5async"]
    assert figures["setups"] == setups
    assert len(figures["median"]) == 2
    for tree in figures["median"].values():
        for setup in setups:
            assert tree[setup]["jobs_per_s"] > 0
            # /proc counts in ticks (10 ms): a quick run's burn-down may read none.
            assert 0 <= tree[setup]["cpu_ms_per_job"] <= tree[setup]["cpu_total_ms_per_job"]
            assert tree[setup]["cpu_total_ms_per_job"] > 0
    assert "| 1p-c16 | jobs/s |" in done.stdout
    worktrees = subprocess.run(
        ["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert "ledon-compare-" not in worktrees.stdout


@pytest.mark.slow
@pytest.mark.postgres_only
def test_only_cpu_measures_one_process_against_the_supervisor(tmp_path: Path) -> None:
    done, cpu = only_part("cpu", tmp_path)
    assert set(cpu["median"]) == {"cpu20_1p-c2", "cpu20_2x-c1"}
    assert all(len(rates) == 1 and rates[0] > 0 for rates in cpu["runs"].values())
    assert "| `run_jobs --processes 2 --concurrency 1` |" in done.stdout


def test_round_trips_leave_out_the_servers_own_checks_and_pipelined_settings() -> None:
    """A foreign-key check runs inside the statement that inserts, and django-ledon's
    ``set_config`` under ``ASYNCHRONOUS_COMMIT`` travels in its statement's pipeline:
    statements, but no round trips of their own."""
    check = 'SELECT 1 FROM ONLY "public"."jobs_job" x WHERE "id" = $1 FOR KEY SHARE OF x'
    cost = {
        "statements": 3.0,
        "top": [
            {"query": "SELECT set_config($1, $2, $3)", "calls": 100},
            {"query": check, "calls": 100},
            {"query": "WITH done AS (SELECT 1)", "calls": 100},
        ],
    }
    assert report._round_trips("django-ledon", "1p-c1/async", cost, 100) == 1.0
    # Without the asynchronous commit, or for a peer, set_config is a round trip.
    assert report._round_trips("django-ledon", "1p-c1", cost, 100) == 2.0
    assert report._round_trips("pgqueuer", "1p-c1/async", cost, 100) == 2.0
    assert report._round_trips("pgqueuer", "1p-c0", {"wal_bytes": 1}, 100) is None


@pytest.mark.slow
@pytest.mark.postgres_only
def test_only_targets_reads_every_target_of_ours_from_one_run(tmp_path: Path) -> None:
    done, figures = only_part("targets", tmp_path)
    rows = {row["what"]: row for row in figures["rows"]}
    # Without a peer in the run, the rows against pgqueuer are left out.
    assert set(rows) == {
        "5 ms handler, concurrency 16: share of the ideal 3,200/s",
        "Claims with every limit set (none binding): ms per job against none",
        "CPU-bound handler, --processes 2 against one process of two threads",
        "`run_jobs --burst` start-up on an empty queue (s), against 0.5 s",
    }
    startup = figures["startup"]
    assert startup["runs"] == len(startup["wall_s"]) == len(startup["cpu_s"]) == 3
    start_row = rows["`run_jobs --burst` start-up on an empty queue (s), against 0.5 s"]
    assert start_row["ours"] == startup["median_wall_s"] > 0
    assert start_row["holds"] == (startup["median_wall_s"] <= 0.5)
    share = rows["5 ms handler, concurrency 16: share of the ideal 3,200/s"]
    assert share["ratio"] == figures["burn"]["median"]["django-ledon"]["sleep5-c16"] / 3200
    assert share["holds"] == (share["ratio"] >= 0.85)
    flow = figures["flow"]["median"]
    limits = rows["Claims with every limit set (none binding): ms per job against none"]
    assert limits["ratio"] == pytest.approx(flow["off"] / flow["every_limit"])
    assert figures["idle"]["latency"]["django-ledon"]["p50_ms"] > 0
    assert "| target | django-ledon | against | ratio | goal | verdict |" in done.stdout


@pytest.mark.slow
@pytest.mark.postgres_only
def test_the_bulk_benchmark_runs_small(tmp_path: Path) -> None:
    done = run_module(
        "benchmarks.bulk", "--database-url", server_url(), "--jobs", "300",
        "--samples", "3", "--out", str(tmp_path),
    )  # fmt: skip
    (written,) = tmp_path.glob("bulk-*.json")
    figures = json.loads(written.read_text())
    assert (figures["jobs"], figures["requeued"]) == (300, 300)
    assert figures["run"]["batches"] == 1
    assert figures["before"]["samples"] == figures["after"]["samples"] == 3
    assert "load average" in done.stdout


@pytest.mark.slow
@pytest.mark.postgres_only
def test_the_operations_on_runs_in_flight_run_quick_and_write_their_figures(
    tmp_path: Path,
) -> None:
    done = run_module(
        "benchmarks.wf_ops", "--quick", "--database-url", server_url(), "--out", str(tmp_path)
    )
    assert "check_workflows: 100 runs of 20 checkpoints in" in done.stdout
    (written,) = tmp_path.glob("wf-ops-*.json")
    raw = json.loads(written.read_text())
    assert raw["sizes"] == {"check_runs": 100, "checkpoints": 20, "fork_checkpoints": 100}
    assert len(raw["check_seconds"]) == len(raw["fork_seconds"]) == 1


@pytest.mark.slow
@pytest.mark.postgres_only
def test_the_workflows_benchmark_runs_quick_and_times_the_replay_and_the_fork(
    tmp_path: Path,
) -> None:
    done = run_module(
        "benchmarks.workflows", "--quick", "--no-dbos", "--replay-steps", "30",
        "--database-url", server_url(), "--out", str(tmp_path),
    )  # fmt: skip
    assert "replay of 30 checkpoints (ms)" in done.stdout
    assert "fork of a run of 30 checkpoints (s)" in done.stdout
    (written,) = tmp_path.glob("workflows-*.json")
    raw = json.loads(written.read_text())
    assert raw["sizes"]["replay_steps"] == 30
    assert len(raw["ledon"]["replay"]) == len(raw["ledon"]["fork"]) == 1
    assert len(raw["ledon"]["signal_latency"]) == raw["sizes"]["signals"] == 3


@pytest.mark.slow
@pytest.mark.postgres_only
def test_the_bulk_benchmark_resumes_failed_runs_small(tmp_path: Path) -> None:
    run_module(
        "benchmarks.bulk", "--runs", "--database-url", server_url(), "--jobs", "300",
        "--samples", "3", "--out", str(tmp_path),
    )  # fmt: skip
    (written,) = tmp_path.glob("bulk-*.json")
    figures = json.loads(written.read_text())
    assert (figures["jobs"], figures["requeued"]) == (300, 300)
    assert figures["backlog_at_end"] == {"queued": 300}
    assert figures["run"]["summary"].startswith("300 run(s) matched: changed 300 (300 resumed)")
