"""The Markdown report (``docs/benchmarks.md``) rendered from a run's raw results."""

from __future__ import annotations

import math
from typing import Any

from .systems import OURS, PEERS

#: (key in the results, row label)
THROUGHPUT_ROWS = [
    ("enqueue_each", "Enqueue, one call (and commit) per job"),
    ("enqueue_bulk", "Enqueue, bulk API"),
]
TARGETS = {
    "burn_pgqueuer": 1.5,
    "burn_procrastinate": 10.0,
    "latency_p50_ms": 5.0,
    "enqueue_each_pgqueuer": 1.5,
    "bulk_jobs_per_s": 20_000.0,
    "claim_cost_ratio": 1.2,
    "flow_control_slowdown": 1.3,
}


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}"


def _ratio(ours: float | None, peer: float | None) -> str:
    if not ours or not peer:
        return "—"
    return f"{ours / peer:.1f}×"


def _systems(document: dict[str, Any]) -> list[str]:
    names = list(document["systems"])
    return [n for n in [OURS, *PEERS] if n in names]


def _burn_keys(document: dict[str, Any]) -> list[tuple[int, int]]:
    return [(c["processes"], c["concurrency"]) for c in document["plan"]["configs"]]


def _burn(entry: dict[str, Any], processes: int, concurrency: int) -> tuple[float | None, str]:
    """The median for this set-up, and the concurrency the system actually ran with
    when it differs ("" when the same)."""
    wanted = f"{processes}p-c{concurrency}"
    ran = entry.get("burn_configs", {}).get(wanted, wanted)
    value = entry.get(f"burn_{ran}")
    if value is None:
        return None, ""
    return value["median"], ("" if ran == wanted else ran.rsplit("-c", 1)[1])


def _median(entry: dict[str, Any], key: str) -> float | None:
    value = entry.get(key)
    return None if value is None else value["median"]


def throughput_table(document: dict[str, Any]) -> str:
    names = _systems(document)
    peers = [n for n in names if n != OURS]
    head = ["Measurement (jobs/s, median)", *names, *[f"{OURS} ÷ {p}" for p in peers]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    systems = document["systems"]

    def row(label: str, values: dict[str, float | None], flags: dict[str, str]) -> None:
        cells = [label]
        for n in names:
            flag = flags.get(n, "")
            cells.append(_num(values.get(n)) + ("" if not flag else " ‡" if flag == "0" else " †"))
        for p in peers:
            cells.append(_ratio(values.get(OURS), values.get(p)))
        lines.append("| " + " | ".join(cells) + " |")

    for key, label in THROUGHPUT_ROWS:
        row(label, {n: _median(systems[n], key) for n in names}, {})
    for processes, concurrency in _burn_keys(document):
        values: dict[str, float | None] = {}
        flags: dict[str, str] = {}
        for n in names:
            values[n], flags[n] = _burn(systems[n], processes, concurrency)
        noun = "process" if processes == 1 else "processes"
        row(f"Burn-down, {processes} worker {noun}, concurrency {concurrency}", values, flags)
    return "\n".join(lines)


def latency_table(document: dict[str, Any]) -> str:
    names = _systems(document)
    systems = document["systems"]
    ours = systems.get(OURS, {}).get("latency", {})
    lines = [
        "| System | Samples | p50 (ms) | p99 (ms) | p50 ratio to ours |",
        "|---|---|---|---|---|",
    ]
    for n in names:
        lat = systems[n].get("latency")
        if not lat:
            continue
        ratio = "—" if n == OURS else _ratio(lat["p50_ms"], ours.get("p50_ms"))
        lines.append(
            f"| {n} | {lat['samples']} | {_num(lat['p50_ms'], 2)} | {_num(lat['p99_ms'], 2)}"
            f" | {ratio} |"
        )
    return "\n".join(lines)


def claim_table(document: dict[str, Any]) -> str:
    cost = document.get("claim_cost")
    if not cost:
        return "_Not measured in this run._"
    empty, loaded = cost["empty"], cost["loaded"]
    rows = [
        ("One claim of 1 job (ms, median)", "claim_1_ms", 2, False),
        ("One claim of 16 jobs (ms, median)", "claim_16_ms", 2, False),
        ("Burn-down, 1 process, concurrency 16 (jobs/s)", "burn_down_1p_c16", 0, True),
    ]
    lines = [
        f"| Measurement | Empty table | {cost['finished_rows']:,} finished jobs | Cost ratio |",
        "|---|---|---|---|",
    ]
    for label, key, digits, higher_is_better in rows:
        if key not in empty:
            continue
        a, b = empty[key], loaded[key]
        ratio = a / b if higher_is_better else b / a
        lines.append(f"| {label} | {_num(a, digits)} | {_num(b, digits)} | {ratio:.2f} |")
    return "\n".join(lines)


def flow_table(document: dict[str, Any]) -> str:
    flow = document.get("flow_control")
    if not flow:
        return "_Not measured in this run._"
    lines = ["| Limits | Burn-down (jobs/s) | Slowdown |", "|---|---|---|"]
    for name, rate in flow["median"].items():
        limits = flow["limits"][name]
        label = (
            "none"
            if not limits
            else ", ".join(f"{key}={value}" for key, value in limits["default"].items())
        )
        slowdown = "—" if name == "off" else f"{flow['slowdown'][name]:.2f}×"
        lines.append(f"| {label} | {_num(rate)} | {slowdown} |")
    return "\n".join(lines)


def targets(document: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, holds) for each target of the benchmark issue."""
    systems = document["systems"]
    ours = systems.get(OURS, {})
    out: list[tuple[str, str, bool | None]] = []
    for peer, goal in (
        ("pgqueuer", TARGETS["burn_pgqueuer"]),
        ("procrastinate", TARGETS["burn_procrastinate"]),
    ):
        if peer not in systems:
            out.append((f"Burn-down ≥ {goal:g}× {peer} at equal resources", "not measured", None))
            continue
        ratios = []
        for processes, concurrency in _burn_keys(document):
            a, _ = _burn(ours, processes, concurrency)
            b, _ = _burn(systems[peer], processes, concurrency)
            if a and b:
                ratios.append((f"{processes}p×{concurrency}", a / b))
        text = ", ".join(f"{k}: {r:.1f}×" for k, r in ratios)
        out.append(
            (
                f"Burn-down ≥ {goal:g}× {peer} at equal resources (every set-up)",
                text,
                all(r >= goal for _, r in ratios) if ratios else None,
            )
        )
    lat = ours.get("latency")
    if lat:
        goal = TARGETS["latency_p50_ms"]
        out.append(
            (
                f"Idle pickup latency p50 ≤ {goal:g} ms",
                f"{lat['p50_ms']:.2f} ms",
                lat["p50_ms"] <= goal,
            )
        )
    each, peer_each = (
        _median(ours, "enqueue_each"),
        _median(systems.get("pgqueuer", {}), "enqueue_each"),
    )
    if each and peer_each:
        goal = TARGETS["enqueue_each_pgqueuer"]
        out.append(
            (
                f"Single enqueue ≥ {goal:g}× pgqueuer",
                f"{each:,.0f} vs {peer_each:,.0f} jobs/s = {each / peer_each:.2f}×",
                each / peer_each >= goal,
            )
        )
    bulk = _median(ours, "enqueue_bulk")
    if bulk:
        goal = TARGETS["bulk_jobs_per_s"]
        out.append((f"Bulk submit ≥ {goal:,.0f} jobs/s", f"{bulk:,.0f} jobs/s", bulk >= goal))
    cost = document.get("claim_cost")
    if cost:
        goal = TARGETS["claim_cost_ratio"]
        worst = max(cost["ratio_claim_1"], cost["ratio_claim_16"])
        burn = ""
        if "burn_down_1p_c16" in cost["empty"]:
            burn_ratio = cost["empty"]["burn_down_1p_c16"] / cost["loaded"]["burn_down_1p_c16"]
            worst = max(worst, burn_ratio)
            burn = f", burn-down {burn_ratio:.2f}"
        out.append(
            (
                f"Claim cost with {cost['finished_rows']:,} finished rows ≤ {goal:g}× empty",
                f"claim of 1: {cost['ratio_claim_1']:.2f}, claim of 16:"
                f" {cost['ratio_claim_16']:.2f}{burn}",
                worst <= goal,
            )
        )
    flow = document.get("flow_control")
    if flow:
        goal = TARGETS["flow_control_slowdown"]
        worst = max(flow["slowdown"].values())
        measured = ", ".join(f"{name}: {value:.2f}×" for name, value in flow["slowdown"].items())
        target = f"Burn-down with limits ≤ {goal:g}× slower than without"
        out.append((target, measured, worst <= goal))
    return out


def extras_section(document: dict[str, Any]) -> str:
    outbox, sagas = document.get("outbox"), document.get("sagas")
    if not outbox or not sagas:
        return "_Not measured in this run._"
    return "\n".join(
        [
            "| Measurement | Median |",
            "|---|---|",
            f"| Outbox dispatch, in-process transport ({outbox['messages']:,} messages,"
            f" one dispatcher) | {outbox['median']:,.0f} messages/s |",
            f"| Saga step, `run_saga` of three no-op steps ({sagas['instances']:,} instances)"
            f" | {sagas['ms_per_step']:.2f} ms per step |",
            f"| For scale: one durable transaction writing one row | {sagas['commit_ms']:.2f} ms |",
        ]
    )


def targets_table(document: dict[str, Any]) -> str:
    lines = ["| Target | Measured | Holds |", "|---|---|---|"]
    for target, measured, holds in targets(document):
        verdict = "n/a" if holds is None else ("yes" if holds else "**no**")
        lines.append(f"| {target} | {measured} | {verdict} |")
    return "\n".join(lines)


def summary_table(document: dict[str, Any]) -> str:
    return "\n\n".join(
        [
            throughput_table(document),
            latency_table(document),
            claim_table(document),
            flow_table(document),
            targets_table(document),
        ]
    )


def render(document: dict[str, Any]) -> str:
    env = document["environment"]
    pg = env["postgresql"]
    plan = document["plan"]
    systems = document["systems"]
    versions = ", ".join(f"{n} {systems[n].get('version', '?')}" for n in _systems(document))
    skipped = document.get("skipped") or {}
    burn_counts = ", ".join(
        dict.fromkeys(
            f"{n} {systems[n][k]['jobs']:,}"
            for n in _systems(document)
            for k in systems[n]
            if k.startswith("burn_") and "jobs" in systems[n][k]
        )
    )
    each_counts = ", ".join(
        f"{n} {systems[n]['enqueue_each']['jobs']:,}"
        for n in _systems(document)
        if "enqueue_each" in systems[n]
    )
    parts = [
        "# Benchmarks",
        "",
        "<!-- Generated by `make bench` (python -m benchmarks); edit benchmarks/report.py,"
        " not this file. -->",
        "",
        "django-ledon against the PostgreSQL job queues a Django or Python team would"
        " otherwise pick, **measured in the same run, on the same server, one system at a"
        " time, with no-op handlers**. Every figure is the median of"
        f" {plan['runs']} run(s); ratios are django-ledon's figure divided by the peer's"
        " (above 1 means django-ledon is faster).",
        "",
        f"Run of {env['date']} on {env['cpus']} CPUs ({env['platform']}), Python"
        f" {env['python']}, PostgreSQL {pg.get('server_version')} with"
        f" fsync={pg.get('fsync')}, synchronous_commit={pg.get('synchronous_commit')},"
        f" full_page_writes={pg.get('full_page_writes')} — every commit is durable."
        f" Versions: {versions}."
        + (
            f" Not measured: {', '.join(f'{k} ({v})' for k, v in skipped.items())}."
            if skipped
            else ""
        ),
        "",
        "## Throughput",
        "",
        throughput_table(document),
        "",
        "† Runs one task at a time per process (django-tasks-db's `db_worker`): its"
        " figure for the same number of processes. ‡ pgqueuer with its defaults"
        " (batches of 10, no concurrency cap) in every row with that process count: an"
        " entrypoint `concurrency_limit` below its batch size makes its worker re-poll"
        " every 100 ms (about 40 jobs/s at a limit of 4), which would not be a fair"
        " figure.",
        "",
        f"Jobs per measurement — enqueue one by one: {each_counts}; bulk:"
        f" {plan['bulk_jobs']:,}; burn-down: {burn_counts}.",
        "",
        "## Idle pickup latency",
        "",
        "From the enqueue's commit to the handler's first line, one job at a time into an"
        " idle worker (one process, concurrency 1). The handler reports its start time"
        " over a loopback UDP datagram.",
        "",
        latency_table(document),
        "",
        "## Claim cost with a long history",
        "",
        "django-ledon only: the same claims on an empty table and with"
        f" {document.get('claim_cost', {}).get('finished_rows', 0):,} finished jobs"
        " (and their attempts) in the tables. The cost ratio is loaded ÷ empty for"
        " times and empty ÷ loaded for throughput (1.00 = no slowdown).",
        "",
        claim_table(document),
        "",
        "## Flow control",
        "",
        "django-ledon only: the burn-down of one worker process at concurrency 16 with"
        " queue limits (J18) that never bind there, against none — what keeping the"
        " limits costs each claim (an advisory lock, the usage read, and with `rate` a"
        " row per start). Slowdown = jobs/s without ÷ jobs/s with.",
        "",
        flow_table(document),
        "",
        "## Outbox and sagas",
        "",
        "django-ledon only (no peer has these): one `Dispatcher` draining integration"
        " events that one unit of work stored, and `run_saga` of a saga whose three steps"
        " do nothing — each step is still a transaction of its own that records its"
        " completion.",
        "",
        extras_section(document),
        "",
        "## Targets",
        "",
        targets_table(document),
        "",
        METHOD,
    ]
    return "\n".join(parts).rstrip() + "\n"


METHOD = """## Method

- **One server, one run.** `make bench` starts a throw-away PostgreSQL with durable
  commits (`fsync=on`, `synchronous_commit=on`), installs every system's schema in
  one database, and measures the systems one after the other, rotating their order
  from run to run. Before each measurement the system's tables are emptied and the
  server checkpoints, so no checkpoint lands inside a measurement.
- **No-op handlers, each in its system's natural form**: a plain function for
  django-ledon (run on the worker's threads) and django-tasks-db, an `async` function
  for pgqueuer and Procrastinate (run on their event loops).
- **Enqueue**: django-ledon `submit_job` / `submit_jobs` (with a caller-chosen job id,
  so every submit is idempotent); pgqueuer `Queries.enqueue` (asyncpg); Procrastinate
  `defer` / `batch_defer` (psycopg); django-tasks-db `Task.enqueue`. The timer covers
  the calls only; the harness's connection is already open.
- **Burn-down**: the worker processes start on an empty queue and run one warm-up
  job; then the jobs are enqueued so that they become visible at one commit. The time
  runs from the first job's start as the system records it (pgqueuer records none:
  from that commit) to the last job's end; jobs/s = jobs ÷ that time. Worker
  settings are each system's defaults apart from the concurrency: django-ledon
  `run_jobs --concurrency N` (claims batches for free capacity and finishes
  completed attempts together with its next claim); pgqueuer `PgQueuer.run()` with
  `batch_size=10` and the entrypoint's `concurrency_limit=N`; Procrastinate
  `run_worker(concurrency=N)`; django-tasks-db `db_worker` (one task at a time,
  1 s polling). All Django-based systems use persistent connections.
- **Raw numbers** of every run are written as JSON to `benchmarks/results/`
  (git-ignored), with the worker logs.
- The machine is small (2 CPUs shared by PostgreSQL, the workers and the harness):
  read the ratios, not the absolute numbers.

## What a django-ledon job costs, and why

Every job django-ledon runs leaves more behind than a queue entry, because of what
it guarantees: the claim mints a fresh attempt token and inserts a Running attempt
row, and the finish updates the job (guarded by that token, with the cancel-versus-
finish decision made by the row's own flag) and the attempt row, and keeps both. Per
job that is two updates of the job row and an insert and an update of an attempt
row, each maintaining its table's indexes, where pgqueuer moves a row once, deletes it
and appends a log line. What the worker does to keep that from costing a commit per
job:

- **Batched claiming**: one statement claims up to `CLAIM_BATCH_SIZE` due jobs for the
  free capacity (`FOR UPDATE SKIP LOCKED`) and, on PostgreSQL, inserts their attempt
  rows in the same statement.
- **Batched completion**: successful attempts are finished together with the claim
  for the capacity they free, in one transaction — on PostgreSQL in one statement,
  run in autocommit: one round trip, no `BEGIN`/`COMMIT` of its own. Each finish
  keeps its own guard (its token, Running, its own cancel flag, its attempt row) and
  its own outcome; they only share the commit, and a missing attempt row makes the
  whole statement change nothing. The handler thread
  that completes the last running job settles the batch itself and runs one of the
  new claims without handing it to another thread; otherwise the worker's main loop
  settles. At concurrency 1 that is one commit per job; at 16, one per 16 jobs.
- **Prepared statements**: that statement and a single submit run as server-side
  prepared statements, planned once per connection (`JOBS["PREPARED_STATEMENTS"]`).
  The batch travels as arrays, so the statement's text never changes with its size;
  the claim's constants are literals and the claimed rows are found through an array
  of ids, so that even the generic plan reads the due index and the primary key
  (a test checks that plan).
- **Fewer index writes**: the job table has no lease index (running jobs are found
  through the partial index of current tokens) and indexes `finished_at` only once
  finished; the attempt table has three indexes (no second index on the token, none
  on the job that `(job, number)` already covers) and keeps 30 % of each page free,
  so finishing an attempt is a HOT update that touches no index. Tokens start with
  the claim's time, so new ones share the token index's last pages however long the
  history.
- **Wake-ups**: a dedicated `LISTEN` connection wakes an idle worker on the
  submitting transaction's commit; a single submit is one statement (insert and
  `pg_notify`) in autocommit: one round trip, one commit.
- **Bulk submit**: `submit_jobs` inserts a batch as ten array parameters
  (`unnest`), one statement whatever the batch size.

## Why some targets cannot hold here

- **Concurrency 1 and 4.** A django-ledon worker claims only for its free capacity
  (SPEC J14): a job never waits, leased, in a worker's memory behind another. At
  concurrency 1 each job therefore costs one durable commit (finishing one attempt and
  claiming the next), and at 4 one commit per four jobs. pgqueuer's figure in those
  rows is its default set-up — batches of 10 with no cap — which holds ten jobs per
  claim whatever the concurrency; Procrastinate commits each job's start and end
  separately. With fsync on, one durable one-row transaction from Django costs
  about as much as pgqueuer spends per job, or more (compare the one-row
  transaction under *Outbox and sagas* with pgqueuer's rate), so 1.5× pgqueuer — or
  10× Procrastinate — at concurrency 1 would need more than one job per commit,
  which the contract rules out.
- **Per-job work.** Per job, django-ledon writes two versions of the job row (each
  non-HOT: its status and token are indexed), inserts an attempt row and updates it,
  and checks the attempt's foreign key — the attempt history, fencing tokens and
  leases the peers do not keep. On 2 CPUs shared by PostgreSQL, the workers and the
  harness, that work, not the worker's Python, sets the burn-down ceiling at
  concurrency 16.
- **Single enqueue.** One call is one statement and one durable commit for every
  system; the commit dominates, which leaves little room between peers.
"""
