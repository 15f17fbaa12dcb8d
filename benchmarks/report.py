"""The results of a run as Markdown tables (``docs/benchmark-results.md``): every
measurement, the ratios against the peers and a verdict per target. Tables only: what
the figures mean is written by hand in ``docs/benchmarks.md``."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from .systems import OURS, PEERS

Document = dict[str, Any]
#: (target, measured, holds: None when not measured)
Target = tuple[str, str, bool | None]

NOT_MEASURED = "_Not measured in this run._"

TARGETS = {
    "floor_fraction_c1": 0.8,
    "commit_fraction_c1": 0.5,
    "c4_pgqueuer": 1.0,
    "c16_pgqueuer": 2.0,
    "bulk_pgqueuer": 1.0,
    "sleep5_ideal": 0.9,
    "queued_cost_ratio": 1.2,
    "burn_pgqueuer": 1.5,
    "burn_procrastinate": 10.0,
    "latency_p50_ms": 5.0,
    "enqueue_each_pgqueuer": 1.5,
    "bulk_jobs_per_s": 20_000.0,
    "claim_cost_ratio": 1.2,
    "flow_control_slowdown": 1.3,
}

#: The burn-downs other than the no-op ones, by the variant their per-job costs carry.
_VARIANTS = {
    "sleep5": "5 ms handler",
    "async": "`ASYNCHRONOUS_COMMIT`",
    "sleep5-async": "5 ms handler, `ASYNCHRONOUS_COMMIT`",
}


# --------------------------------------------------------------------------- helpers


def _num(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}"


def _ratio(ours: float | None, peer: float | None) -> str:
    if not ours or not peer:
        return "—"
    return f"{ours / peer:.1f}×"


def table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table; :data:`NOT_MEASURED` without rows."""
    if not rows:
        return NOT_MEASURED
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def columns(rows: Sequence[dict[str, Any]]) -> str:
    """A Markdown table of ``rows`` given as {heading: cell}, every row with the same
    headings; :data:`NOT_MEASURED` without rows."""
    return table(list(rows[0]) if rows else [], [list(row.values()) for row in rows])


def _systems(document: Document) -> list[str]:
    names = list(document["systems"])
    return [n for n in [OURS, *PEERS] if n in names]


def _ours(document: Document) -> dict[str, Any]:
    ours: dict[str, Any] = document["systems"].get(OURS, {})
    return ours


def _median(entry: dict[str, Any], key: str) -> float | None:
    value = entry.get(key)
    return None if value is None else value["median"]


def _burn(
    entry: dict[str, Any], processes: int, concurrency: int, kind: str = "burn"
) -> tuple[float | None, str]:
    """The median for this set-up (``kind``: ``burn`` for the no-op handler, ``sleep5``
    for the 5 ms one), and the concurrency the system actually ran with when it
    differs ("" when the same)."""
    wanted = f"{processes}p-c{concurrency}"
    ran = entry.get("burn_configs", {}).get(wanted, wanted)
    value = entry.get(f"{kind}_{ran}")
    if value is None:
        return None, ""
    return value["median"], ("" if ran == wanted else ran.rsplit("-c", 1)[1])


def _burn_keys(document: Document) -> list[tuple[int, int]]:
    return [(c["processes"], c["concurrency"]) for c in document["plan"]["configs"]]


def _parse_key(key: str) -> tuple[int, int, str]:
    """A per-job costs' key (``2p-c16``, ``1p-c16/sleep5``): processes, concurrency
    and variant (empty for a no-op burn-down); also the tables' order of set-ups."""
    config, _, variant = key.partition("/")
    processes, concurrency = config.split("p-c")
    return int(processes), int(concurrency), variant


def _setup(key: str) -> str:
    """A per-job costs' key as the tables show it."""
    processes, concurrency, variant = _parse_key(key)
    setup = f"{processes} × {concurrency or 'defaults'}"
    if variant.startswith("limits-"):
        return f"{setup}, limits: {variant[7:]}"
    return f"{setup}, {_VARIANTS.get(variant, variant)}" if variant else setup


def _cpus(cost: dict[str, Any]) -> str:
    """The CPUs busy during a burn-down, of the machine's."""
    if "cpus_busy" not in cost:
        return "—"
    return f"{cost['cpus_busy']:.2f} of {cost['cpus']:.0f}"


def _scale_setups(ours: dict[str, Any]) -> list[tuple[int, int]]:
    """The scale-out curve's (processes, concurrency), fewest processes first."""
    setups = [k[6:].split("p-c") for k in ours if k.startswith("scale_")]
    return sorted((int(p), int(c)) for p, c in setups)


def _round_trips(system: str, key: str, cost: dict[str, Any], jobs: int) -> float | None:
    """Statements per job less those that were no round trip of their own: the
    server's foreign-key checks, and django-ledon's ``set_config`` pipelined with its
    statement under ``ASYNCHRONOUS_COMMIT`` (both counted from the commonest
    statements recorded, where they always are)."""
    if "statements" not in cost:
        return None
    internal = 0.0
    for row in cost.get("top", []):
        query = row["query"]
        foreign_key = query.startswith("SELECT 1 FROM ONLY") and "FOR KEY SHARE" in query
        pipelined = system == OURS and "async" in key and query.startswith("SELECT set_config(")
        if foreign_key or pipelined:
            internal += row["calls"]
    return float(cost["statements"]) - internal / jobs


def sleep_line(document: Document) -> tuple[float, float, int] | None:
    """django-ledon's 5 ms handler: jobs/s, the ideal rate, the concurrency."""
    ours = _ours(document)
    key = next((k for k in ours if k.startswith("sleep5_")), None)
    if key is None:
        return None
    concurrency = int(key.rsplit("-c", 1)[1])
    return ours[key]["median"], concurrency / 0.005, concurrency


# --------------------------------------------------------------------------- tables


def throughput_table(document: Document) -> str:
    """Every system's rates, and ours over each peer's."""
    names = _systems(document)
    peers = [n for n in names if n != OURS]
    systems = document["systems"]
    rows = []

    def row(label: str, cells: dict[str, tuple[float | None, str]]) -> None:
        marks = {"": "", "0": " ‡"}
        values = [_num(cells[n][0]) + marks.get(cells[n][1], " †") for n in names]
        ours = cells.get(OURS, (None, ""))[0]
        ratios = [_ratio(ours, cells[p][0]) for p in peers]
        rows.append([label, *values, *ratios])

    for key, label in (
        ("enqueue_each", "Enqueue, one call (and commit) per job"),
        ("enqueue_bulk", "Enqueue, bulk API"),
    ):
        row(label, {n: (_median(systems[n], key), "") for n in names})
    for processes, concurrency in _burn_keys(document):
        noun = "process" if processes == 1 else "processes"
        label = f"Burn-down, {processes} worker {noun}, concurrency {concurrency}"
        row(label, {n: _burn(systems[n], processes, concurrency) for n in names})
    concurrency = document["plan"].get("sleep_concurrency")
    if concurrency:
        cells = {n: _burn(systems[n], 1, concurrency, "sleep5") for n in names}
        if any(value for value, _ in cells.values()):
            row(f"Burn-down, 5 ms handler, 1 process, concurrency {concurrency}", cells)
    head = ["Measurement (jobs/s, median)", *names, *[f"{OURS} ÷ {p}" for p in peers]]
    return table(head, rows)


def cpu_table(document: Document) -> str:
    """The CPU-bound handler (pure Python for about 20 ms) run by one worker process
    and by ``run_jobs --processes``, the same handler threads in all."""
    ours = _ours(document)
    keys = sorted(k for k in ours if k.startswith("cpu20_"))
    single = next((ours[k]["median"] for k in keys if "x" not in k), None)
    rows = []
    for key in keys:
        setup = key[len("cpu20_") :]
        if "x" in setup:
            processes, concurrency = setup.split("x-c")
            label = f"`run_jobs --processes {processes} --concurrency {concurrency}`"
        else:
            label = f"one worker process, `--concurrency {setup.split('p-c')[1]}`"
        rows.append([label, _num(ours[key]["median"]), _ratio(ours[key]["median"], single)])
    return table(["Set-up (same handler threads in all)", "jobs/s (median)", "÷ one process"], rows)


def latency_table(document: Document) -> str:
    ours = _ours(document).get("latency", {})
    rows = []
    for n in _systems(document):
        lat = document["systems"][n].get("latency")
        if lat:
            ratio = "—" if n == OURS else _ratio(lat["p50_ms"], ours.get("p50_ms"))
            rows.append([n, lat["samples"], _num(lat["p50_ms"], 2), _num(lat["p99_ms"], 2), ratio])
    return table(["System", "Samples", "p50 (ms)", "p99 (ms)", "p50 ratio to ours"], rows)


#: The rows of the claim-cost tables: (label, key, digits).
_CLAIMS = (
    ("One claim of 1 job (ms, median)", "claim_1_ms", 2),
    ("One claim of 16 jobs (ms, median)", "claim_16_ms", 2),
    ("Server execution per claimed job (ms)", "server_ms_per_job", 3),
    ("WAL per claimed job (bytes)", "wal_bytes_per_job", 0),
    ("Burn-down, 1 process, concurrency 16 (jobs/s)", "burn_down_1p_c16", 0),
)


def _cost_rows(low: dict[str, Any], high: dict[str, Any], suffix: str = "") -> list[list[str]]:
    """A row of each of :data:`_CLAIMS` measured in both: the figure in ``low`` and in
    ``high``, and the cost ratio (high's over low's; of a rate, low's over high's)."""
    rows = []
    for label, key, digits in _CLAIMS:
        if key in low and key in high:
            a, b = (high[key], low[key]) if "burn_down" in key else (low[key], high[key])
            ratio = f"{b / a:.2f}" if a else "—"
            rows.append([label + suffix, _num(low[key], digits), _num(high[key], digits), ratio])
    return rows


def claim_table(document: Document) -> str:
    cost = document.get("claim_cost")
    if not cost:
        return NOT_MEASURED
    loaded = f"{cost['finished_rows']:,} finished jobs"
    rows = _cost_rows(cost["empty"], cost["loaded"])
    return table(["Measurement", "Empty table", loaded, "Cost ratio"], rows)


def floor_table(document: Document) -> str:
    ours = _ours(document)
    floor, c1 = _median(ours, "floor"), _burn(ours, 1, 1)[0]
    if floor is None:
        return NOT_MEASURED
    rows: list[list[Any]] = [
        [
            "Floor: our finish-and-claim statement back to back, one connection"
            f" ({ours['floor']['jobs']:,} jobs)",
            _num(floor),
            f"{1000 / floor:.2f}",
        ]
    ]
    for key in sorted((k for k in ours if k.startswith("commit_")), key=lambda k: int(k[7:])):
        clients, tps = int(key[7:]), ours[key]["median"]
        noun = "client" if clients == 1 else "clients"
        label = f"One-row `UPDATE` commits, {clients} {noun} (pgbench)"
        rows.append([label, _num(tps), f"{1000 / tps * clients:.2f}"])
    if c1:
        rows.append(["Our worker, 1 process, concurrency 1", _num(c1), f"{1000 / c1:.2f}"])
    return table(["Measurement", "per second", "ms each"], rows)


def scale_table(document: Document) -> str:
    ours = _ours(document)
    setups = _scale_setups(ours)
    locks, costs = ours.get("locks_during_scale", {}), ours.get("per_job", {})
    rows = []
    for processes, concurrency in setups:
        key = f"{processes}p-c{concurrency}"
        rate = ours[f"scale_{key}"]["median"]
        first = ours[f"scale_{setups[0][0]}p-c{setups[0][1]}"]["median"]
        lock = locks.get(key, {})
        events = ", ".join(f"{k} {v}" for k, v in list(lock.get("wait_events", {}).items())[:3])
        waits = ", ".join(f"{k} {v}" for k, v in list(lock.get("waits_for", {}).items())[:2])
        waiting = (
            f"{lock.get('mean_waiting_on_lock', 0):.2f} / {lock.get('most_waiting_on_lock', 0):.0f}"
        )
        rows.append(
            {
                "Worker processes × concurrency": f"{processes} × {concurrency}",
                "jobs/s": _num(rate),
                "vs 1 process": f"{rate / first:.2f}",
                "CPUs busy": _cpus(costs.get(key, {})),
                "backends waiting on a lock (mean / most)": waiting,
                "ungranted locks (mean)": f"{lock.get('mean_ungranted_locks', 0):.2f}",
                "backends active (mean)": f"{lock.get('mean_active', 0):.1f}",
                "commonest waits": events or "—",
                "who waited for whom (samples)": waits or "—",
            }
        )
    return columns(rows)


def per_job_table(document: Document) -> str:
    rows = []
    for name in _systems(document):
        costs = document["systems"][name].get("per_job", {})
        for key in sorted(costs, key=_parse_key):
            cost = costs[key]
            trips = _round_trips(name, key, cost, int(cost.get("jobs", 1)))
            rows.append(
                {
                    "System": name,
                    "Set-up (processes × concurrency)": _setup(key),
                    "Statements per job": _num(cost.get("statements"), 2),
                    "Round trips per job": _num(trips, 2),
                    "WAL bytes per job": _num(cost.get("wal_bytes")),
                    "Worker CPU ms per job": _num(cost.get("worker_cpu_ms"), 3),
                    "CPUs busy": _cpus(cost),
                }
            )
    return columns(rows)


#: The parts of one job's time in the profile: (key, label).
_PARTS = (
    ("python_around_statement_ms", "Python around the statement (arguments, parameters, rows)"),
    ("round_trip_ms", "Round trip (network, protocol, bind; the statement less the two below)"),
    ("server_execution_ms", "Server execution of the statement (`pg_stat_statements`)"),
    ("commit_wal_flush_ms", "Commit: the WAL flush (`pg_stat_wal` sync time)"),
    ("handoff_and_handler_ms", "Hand-off to the handler and the handler (`Slots._run_handler`)"),
    ("return_to_next_statement_ms", "Return to the next statement (the worker's book-keeping)"),
)


def profile_section(document: Document) -> str:
    prof = document.get("profile")
    if not prof:
        return NOT_MEASURED
    levels = [prof[k] for k in ("c1", "c4") if k in prof]
    rows: list[list[Any]] = [
        [label, *(_num(level.get(key), 3) for level in levels)] for key, label in _PARTS
    ]
    pad = [""] * (len(levels) - 1)
    rows += [
        ["**Wall time per job**", *(f"**{level['wall_ms_per_job']:.3f}**" for level in levels)],
        [
            "Statements per job; WAL syncs per job",
            *(f"{lv['statements_per_job']:.2f}; {lv['wal_syncs_per_job']:.2f}" for lv in levels),
        ],
        ["One WAL sync (ms)", *(f"{level['wal_sync_ms']:.3f}" for level in levels)],
        ["For scale: a prepared `SELECT 1` (ms)", f"{prof['round_trip_ms']:.3f}", *pad],
    ]
    explain = prof.get("explain")
    if explain:
        rows.append(
            [
                "`EXPLAIN (ANALYZE, BUFFERS, WAL)` of one finish-and-claim: ms executing;"
                " buffers hit; WAL records; WAL bytes",
                f"{explain.get('execution_ms')}; {explain.get('shared_hit_blocks')};"
                f" {explain.get('wal_records')}; {explain.get('wal_bytes')}",
                *pad,
            ]
        )
    head = ["ms per job", *(f"concurrency {k[1:]}" for k in ("c1", "c4") if k in prof)]
    top = [
        [f"`{r['function']}`", f"{r['calls_per_job']:.2f}", f"{r['own_us_per_job']:.0f}"]
        for r in prof.get("c1", {}).get("top", [])[:8]
    ]
    functions = "Costliest functions at concurrency 1 (cProfile, own time)"
    if not top:
        return table(head, rows)
    return table(head, rows) + "\n\n" + table([functions, "calls per job", "own µs per job"], top)


def cpu_parts_table(document: Document) -> str:
    """The worker's own CPU per job, by part (``benchmarks/cpu_parts.py``)."""
    from .cpu_parts import format_table

    parts = document.get("cpu_parts")
    return format_table(parts) if parts else NOT_MEASURED


def startup_line(document: Document) -> str:
    """``run_jobs --burst`` on an empty queue: the medians of its runs (a table, as
    every figure of the report)."""
    part = document.get("startup")
    if not part:
        return NOT_MEASURED
    head = ["`run_jobs --burst` on an empty queue", "runs", "median s, start to exit",
            "median s of CPU"]  # fmt: skip
    row = ["django-ledon", part["runs"], f"{part['median_wall_s']:.3f}",
           f"{part['median_cpu_s']:.3f}"]  # fmt: skip
    return table(head, [row])


def sleep_table(document: Document) -> str:
    """django-ledon's 5 ms handler against the ideal rate, and where a handler slot's
    time went (``benchmarks/profiling.py``)."""
    sleep = sleep_line(document)
    if sleep is None:
        return NOT_MEASURED
    rate, ideal, concurrency = sleep
    rows: list[list[Any]] = [
        [f"5 ms handler, 1 worker process, concurrency {concurrency} (jobs/s)", _num(rate)],
        [f"The ideal: {concurrency} handlers each finishing 200 jobs a second", _num(ideal)],
        ["Share of the ideal", f"{rate / ideal:.0%}"],
    ]
    slot = document.get("slot_profile")
    if slot and "next_job_ms" in slot:
        parts = [
            ("the handler (from its start: the 5 ms sleep, its call, the lock after it)",
             "handler_ms"),
            ("to its next job: waiting for a claim (the look-ahead ran dry)",
             "waiting_for_claim_ms"),
            ("to its next job: woken (its claim committed, the thread not yet running)",
             "woken_ms"),
        ]  # fmt: skip
        rest = slot["next_job_ms"] - slot["waiting_for_claim_ms"] - slot["woken_ms"]
        turn = slot["handler_ms"] + slot["next_job_ms"]
        rows += [
            [
                f"Profiled ({slot['jobs']:,} jobs, concurrency {slot['concurrency']}): jobs/s",
                _num(slot["jobs_per_s"]),
            ],
            *([f"A slot's turn, ms: {label}", f"{slot[key]:.2f}"] for label, key in parts),
            ["A slot's turn, ms: to its next job: the rest (its own book-keeping)",
             f"{rest:.2f}"],
            ["A slot's turn, ms: **all of it**", f"**{turn:.2f}**"],
            [
                "Settles: jobs per settle; its statement, the server's execution in it "
                "and one WAL sync (ms)",
                f"{slot['jobs_per_settle']:.1f}; {slot['settle_ms']:.2f}; "
                f"{slot.get('settle_server_ms', 0.0):.2f}; {slot['wal_sync_ms']:.2f}",
            ],
        ]  # fmt: skip
    return table(["Measurement", "Value"], rows)


def syncmode_table(document: Document) -> str:
    """``JOBS["ASYNCHRONOUS_COMMIT"]`` off and on, measured one right after the other."""
    ours = _ours(document)
    names = sorted({k[9:].rsplit("_", 1)[0] for k in ours if k.startswith("syncmode_")})
    rows = []
    for name in names:
        durable = _median(ours, f"syncmode_{name}_durable")
        fast = _median(ours, f"syncmode_{name}_async")
        label = (
            "1 worker process, concurrency 1, no-op handler"
            if name == "c1"
            else f"1 worker process, concurrency {name.rsplit('_c', 1)[1]}, 5 ms handler"
        )
        rows.append(
            {
                "Burn-down (jobs/s, median)": label,
                "durable commits (default)": _num(durable),
                "`ASYNCHRONOUS_COMMIT`": _num(fast),
                "async ÷ durable": _ratio(fast, durable),
            }
        )
    return columns(rows)


def queued_table(document: Document) -> str:
    cost = document.get("queued_claim_cost")
    if not cost:
        return NOT_MEASURED
    rows = _cost_rows(cost["shallow"], cost["deep"], ", right after a checkpoint")
    if "steady" in cost["deep"]:
        warm = f", after {cost['warm_claims']:,} claims since the checkpoint"
        rows += _cost_rows(cost["shallow"]["steady"], cost["deep"]["steady"], warm)
    shallow, deep = f"{cost['shallow_rows']:,} queued", f"{cost['deep_rows']:,} queued"
    return table(["Measurement", shallow, deep, "Cost ratio"], rows)


def flow_table(document: Document) -> str:
    flow = document.get("flow_control")
    if not flow:
        return NOT_MEASURED
    rows = []
    for name, rate in flow["median"].items():
        limits = flow["limits"][name]
        label = ", ".join(f"{k}={v}" for k, v in limits["default"].items()) if limits else "none"
        slowdown = "—" if name == "off" else f"{flow['slowdown'][name]:.2f}×"
        rows.append([label, _num(rate), slowdown])
    return table(["Limits", "Burn-down (jobs/s)", "Slowdown"], rows)


def fair_table(part: dict[str, Any]) -> str:
    """The figures of :func:`fair_share` as a Markdown table."""
    burn, noisy, submit = part["burn"], part["noisy"], part["submit"]
    fair, order = noisy["median"]["fair"], noisy["median"]["submission order"]
    rows = [
        [
            f"Burn-down, one scope holds the queue ({burn['jobs']:,} jobs, 1×16)",
            f"{burn['median']['fair']:,.0f} jobs/s",
            f"{burn['median']['submission order']:,.0f} jobs/s",
            f"{burn['ratio']:.2f}× (goal ≥ 0.9×)",
        ],
        [
            f"Noisy neighbour: last small scope's last start after its submission"
            f" ({noisy['backlog']:,} + {noisy['small_scopes']}×{noisy['small_jobs']} jobs, 1×16)",
            f"{fair['max_lag']:.2f} s (median scope {fair['median_lag']:.2f} s)",
            f"{order['max_lag']:.2f} s (median scope {order['median_lag']:.2f} s)",
            "goal ≤ 2 s fair",
        ],
        [
            "Noisy neighbour: the whole run",
            f"{fair['rate']:,.0f} jobs/s",
            f"{order['rate']:,.0f} jobs/s",
            f"{fair['rate'] / order['rate']:.2f}×",
        ],
    ]
    out = table(["Measurement", "Fair share", "Submission order", "Ratio"], rows)
    submits = [
        [name, f"{micros:,.0f} µs", "—" if name == "plain" else f"{submit['ratio'][name]:.2f}×"]
        for name, micros in submit["median"].items()
    ]
    return (
        out
        + "\n\n"
        + table([f"One submit ({submit['submits']:,} calls)", "Median", "Against plain"], submits)
    )


def ordering_table(part: dict[str, Any]) -> str:
    """The figures of :func:`benchmarks.ordering.ordering` as a Markdown table."""
    submit, fan, drain = part["submit"], part["fan_in"], part["sequences"]
    rows = [
        [
            f"Submit {submit['jobs']:,} jobs: submit_batch against submit_jobs",
            f"{submit['median']['submit_batch']:.3f} s",
            f"{submit['median']['submit_jobs']:.3f} s",
            f"{submit['ratio']:.2f}× (goal ≤ 1.2×)",
        ],
        [
            f"Statements per finished job, {fan['round']} finishes per finish-and-claim"
            f" ({fan['jobs']:,} jobs)",
            f"{fan['figures']['batch']['per_job']:.3f} (in a batch)",
            f"{fan['figures']['no batch']['per_job']:.3f} (in none)",
            "no statement per job more",
        ],
        [
            f"Drain {drain['keys']:,} sequence keys × {drain['jobs_per_key']} jobs (1×16)",
            f"{drain['median']['sequences']:,.0f} jobs/s",
            f"{drain['median']['no keys']:,.0f} jobs/s (no keys)",
            f"{drain['ratio']:.2f}× the time (goal ≤ 1.3×)",
        ],
    ]
    return table(["Measurement", "Batches, sequences", "Without", "Ratio"], rows)


def extras_section(document: Document) -> str:
    outbox, sagas = document.get("outbox"), document.get("sagas")
    if not outbox or not sagas:
        return NOT_MEASURED
    rows = [
        [
            f"Outbox dispatch, in-process transport ({outbox['messages']:,} messages,"
            " one dispatcher)",
            f"{outbox['median']:,.0f} messages/s",
        ],
        [
            f"Saga step, `run_saga` of three no-op steps ({sagas['instances']:,} instances)",
            f"{sagas['ms_per_step']:.2f} ms per step",
        ],
        ["For scale: one durable transaction writing one row", f"{sagas['commit_ms']:.2f} ms"],
    ]
    return table(["Measurement", "Median"], rows)


def outbox_order_table(document: Document) -> str:
    """Ordered outbox delivery: the key cost (ratios against the keyless drain of the
    same runs) and the order run, keyed against keyless, with its violations."""
    part = document.get("outbox_order")
    if not part:
        return NOT_MEASURED
    cost, order = part["key_cost"], part["order"]

    def server(figures: dict[str, Any], figure: str, digits: int) -> str:
        return _num(figures.get(figure), digits)

    rows = [
        [
            f"Drain of {cost['messages']:,} messages, one dispatcher: {name}",
            f"{cost['median'][name]:,.0f} messages/s",
            f"{cost['cost'][name]:.2f}×",
            server(cost.get("per_message", {}).get(name, {}), "statements", 3),
            server(cost.get("per_message", {}).get(name, {}), "server_us", 1),
            server(cost.get("per_message", {}).get(name, {}), "client_cpu_us", 0),
            f"{cost['store_seconds'][name]:.2f} s",
        ]
        for name in cost["median"]
    ]
    run = (
        f"{order['keys']} keys × {order['per_key']:,} messages, {order['dispatchers']}"
        f" dispatchers, {order['fail_ratio']:.0%} of publishes failing"
    )
    keyed = (
        f": keyed ({order['failed_publishes']:,} failed publishes; {order['violations']}"
        f" order violations; {order['keys_in_order']} of {order['keys']} keys whole and"
        " in stored order)"
    )
    for name, label, ratio in (
        ("keyless", ": the same without keys", 1.0),
        ("keyed", keyed, order["cost"]),
    ):
        figures = order.get("per_message", {}).get(name, {})
        rows.append(
            [
                run + label,
                f"{order['median'][name]:,.0f} messages/s",
                f"{ratio:.2f}×",
                server(figures, "statements", 3),
                server(figures, "server_us", 1),
                "—",
                f"{order['store_seconds'][name]:.2f} s",
            ]
        )
    head = ["Measurement", "Median", "Cost against keyless", "Statements/message"]
    head += ["Server µs/message", "Dispatcher CPU µs/message", "Stored in"]
    return table(head, rows)


def bulk_table(bulk: dict[str, Any]) -> str:
    """The table of ``--only bulk``: jobs/s (median) and per job WAL and statements,
    with each system's rate as a multiple of django-ledon's."""
    ours = bulk["median"].get(OURS)
    rows = []
    for name, rate in bulk["median"].items():
        cost = bulk["per_job"].get(name, {})
        statements = cost.get("statements")
        rows.append(
            {
                "System": name,
                "Jobs/s": _num(rate),
                "django-ledon ÷ system": f"{ours / rate:.2f}×" if ours and rate else "—",
                "µs/job": _num(1e6 / rate if rate else None, 1),
                "server µs/job": _num(cost.get("server_us"), 1),
                "WAL bytes/job": _num(cost.get("wal_bytes")),
                "Statements/job": "—" if statements is None else f"{statements:.4f}",
            }
        )
    rounds = len(next(iter(bulk["runs"].values())))
    title = f"Bulk enqueue of {bulk['jobs']:,} jobs, medians of {rounds} interleaved rounds"
    return f"{title}\n\n{columns(rows)}"


def compare_table(document: Document) -> str:
    """``--compare REV``: the same burn-downs of this tree and of another commit,
    interleaved: jobs/s, the workers' CPU (user and system, every worker process) and
    the statements per job, and this tree's figure over the other's."""
    compare = document.get("compare")
    if not compare:
        return NOT_MEASURED
    names = list(compare["median"])
    rows = []
    for setup in compare["setups"]:
        for label, field, digits in (
            ("jobs/s", "jobs_per_s", 0),
            ("worker CPU ms per job", "cpu_ms_per_job", 3),
            ("worker CPU ms per job, start-up included", "cpu_total_ms_per_job", 3),
            ("statements per job", "statements", 2),
        ):
            values = [compare["median"][n].get(setup, {}).get(field) for n in names]
            ratio = f"{values[0] / values[1]:.2f}" if values[0] and values[1] else "—"
            rows.append([setup, label, *(_num(v, digits) for v in values), ratio])
    head = ["Burn-down", "Figure", *(f"`{n}`" for n in names), f"{names[0]} ÷ {names[1]}"]
    return table(head, rows)


# --------------------------------------------------------------------------- targets


def _at_least(
    label: str, ours: float | None, theirs: float | None, goal: str, unit: str = ""
) -> Target | None:
    """The target that ``ours ÷ theirs`` reaches :data:`TARGETS` ``[goal]`` (``{goal}``
    in ``label`` stands for it); None unless both are measured."""
    if not ours or not theirs:
        return None
    ratio = ours / theirs
    measured = f"{ours:,.0f} ÷ {theirs:,.0f} = {ratio:.2f}{unit}"
    return (label.format(goal=TARGETS[goal]), measured, ratio >= TARGETS[goal])


def _highest(label: str, ratios: dict[str, float], goal: str, unit: str = "") -> Target:
    """The target that none of ``ratios`` exceeds :data:`TARGETS` ``[goal]``."""
    measured = ", ".join(f"{name}: {ratio:.2f}{unit}" for name, ratio in ratios.items())
    return (label.format(goal=TARGETS[goal]), measured, max(ratios.values()) <= TARGETS[goal])


def targets(document: Document) -> list[Target]:
    """The targets of a full run: against the server's limits, against the peers and
    in absolute terms (each left out unless what it reads was measured)."""
    systems, ours = document["systems"], _ours(document)
    pgq = systems.get("pgqueuer", {})
    c1 = _burn(ours, 1, 1)[0]
    out = [
        _at_least("Concurrency 1 ≥ {goal:g} of the floor loop", c1, _median(ours, "floor"),
                  "floor_fraction_c1"),
        _at_least("Concurrency 1 ≥ {goal:g} of the one-row commit rate", c1,
                  _median(ours, "commit_1"), "commit_fraction_c1"),
        *(_at_least(f"Concurrency {c} ≥ {{goal:g}}× pgqueuer", _burn(ours, 1, c)[0],
                    _burn(pgq, 1, c)[0], f"c{c}_pgqueuer", "×") for c in (4, 16)),
    ]  # fmt: skip
    scale = [(p, ours[f"scale_{p}p-c{c}"]["median"]) for p, c in _scale_setups(ours)]
    if len(scale) > 1:
        never = all(b >= a for (_, a), (_, b) in itertools.pairwise(scale))
        measured = ", ".join(f"{p}p: {r:,.0f}" for p, r in scale)
        out.append(("Scale-out: throughput never falls as processes are added", measured, never))
    bulk = _median(ours, "enqueue_bulk")
    out.append(
        _at_least("Bulk submit ≥ {goal:g}× pgqueuer's bulk", bulk, _median(pgq, "enqueue_bulk"),
                  "bulk_pgqueuer", "×")
    )  # fmt: skip
    sleep = sleep_line(document)
    if sleep:
        label = f"5 ms handler at concurrency {sleep[2]} ≥ {{goal:.0%}} of the ideal"
        out.append(_at_least(label, sleep[0], sleep[1], "sleep5_ideal"))
    queued = document.get("queued_claim_cost")
    if queued:
        # The steady phase where measured: the cold one adds the page images a
        # checkpoint cycle writes once per page.
        phase = "steady_" if "steady_ratio_claim_1" in queued else ""
        one_job, batch = queued[f"{phase}ratio_claim_1"], queued[f"{phase}ratio_claim_16"]
        measured = f"{phase.rstrip('_') or 'cold'}: claim of 1 {one_job:.2f}, of 16 {batch:.2f}"
        goal = TARGETS["queued_cost_ratio"]
        label = f"Claim cost with {queued['deep_rows']:,} queued ≤ {goal:g}×"
        label += f" {queued['shallow_rows']:,} queued"
        out.append((label, measured, max(one_job, batch) <= goal))
    for peer in ("pgqueuer", "procrastinate"):
        goal = TARGETS[f"burn_{peer}"]
        label = f"Burn-down ≥ {goal:g}× {peer} at equal resources (every set-up)"
        if peer not in systems:
            out.append((label, "not measured", None))
            continue
        ratios = []
        for processes, concurrency in _burn_keys(document):
            a, b = (
                _burn(ours, processes, concurrency)[0],
                _burn(systems[peer], processes, concurrency)[0],
            )
            if a and b:
                ratios.append((f"{processes}p×{concurrency}", a / b))
        text = ", ".join(f"{k}: {r:.1f}×" for k, r in ratios)
        out.append((label, text, all(r >= goal for _, r in ratios) if ratios else None))
    lat = ours.get("latency")
    if lat:
        goal = TARGETS["latency_p50_ms"]
        label = f"Idle pickup latency p50 ≤ {goal:g} ms"
        out.append((label, f"{lat['p50_ms']:.2f} ms", lat["p50_ms"] <= goal))
    out.append(
        _at_least("Single enqueue ≥ {goal:g}× pgqueuer", _median(ours, "enqueue_each"),
                  _median(pgq, "enqueue_each"), "enqueue_each_pgqueuer", "×")
    )  # fmt: skip
    if bulk:
        goal = TARGETS["bulk_jobs_per_s"]
        out.append((f"Bulk submit ≥ {goal:,.0f} jobs/s", f"{bulk:,.0f} jobs/s", bulk >= goal))
    cost = document.get("claim_cost")
    if cost:
        costs = {"claim of 1": cost["ratio_claim_1"], "claim of 16": cost["ratio_claim_16"]}
        if "burn_down_1p_c16" in cost["empty"]:
            burn = cost["empty"]["burn_down_1p_c16"] / cost["loaded"]["burn_down_1p_c16"]
            costs["burn-down"] = burn
        label = f"Claim cost with {cost['finished_rows']:,} finished rows ≤ {{goal:g}}× empty"
        out.append(_highest(label, costs, "claim_cost_ratio"))
    flow = document.get("flow_control")
    if flow:
        label = "Burn-down with limits ≤ {goal:g}× slower than without"
        out.append(_highest(label, flow["slowdown"], "flow_control_slowdown", "×"))
    return [target for target in out if target is not None]


def worker_targets(document: Document) -> list[dict[str, Any]]:
    """The worker's targets of ``--only targets`` (its parts' figures: ``burn``,
    ``flow``, ``cpu``, ``idle``): what, ours, against (pgqueuer unless said), ratio,
    goal and whether it holds; a row is left out unless both figures are measured."""
    burn, flow, cpu = document["burn"]["median"], document["flow"]["median"], document["cpu"]
    ours, peer = burn.get(OURS, {}), burn.get("pgqueuer", {})
    per_job = document["burn"].get("per_job", {})
    ours_cost = per_job.get(OURS, {}).get("1x16", {})
    peer_cost = per_job.get("pgqueuer", {}).get("1x16", {})
    startup = document.get("startup", {}).get("median_wall_s")
    threads = [v["median"] for k, v in cpu["median"].items() if "x-c1" not in k]
    processes = [v["median"] for k, v in cpu["median"].items() if "x-c1" in k]
    latency, enqueue = document["idle"]["latency"], document["idle"]["enqueue_each"]
    best_peer = min((v["p50_ms"] for k, v in latency.items() if k != OURS), default=None)
    # (what, ours, against, goal, at most): a claim's cost is the inverse of the
    # burn-down's rate, the seconds a job takes with every limit set over those without.
    wanted: list[tuple[str, float | None, float | None, float, bool]] = [
        ("Worker CPU ms per job, no-op, concurrency 16, during the burn-down",
         ours_cost.get("worker_cpu_ms"), peer_cost.get("worker_cpu_ms"), 1.0, True),
        ("Worker CPU ms per job, no-op, concurrency 16, start-up included",
         ours_cost.get("worker_cpu_total_ms"), peer_cost.get("worker_cpu_total_ms"), 1.0, True),
        ("5 ms handler, concurrency 16: share of the ideal 3,200/s", ours.get("sleep5-c16"),
         3200, 0.85, False),
        ("5 ms handler, concurrency 64", ours.get("sleep5-c64"), peer.get("sleep5-c64"), 1.0,
         False),
        ("`async def` 5 ms handler, concurrency 64", ours.get("sleep5async-c64"),
         peer.get("sleep5async-c64"), 1.2, False),
        ("No-op, 1 process, concurrency 4", ours.get("1x4"), peer.get("1x4"), 1.0, False),
        ("No-op, 1 process, concurrency 16", ours.get("1x16"), peer.get("1x16"), 1.5, False),
        ("No-op, 2 processes x 16", ours.get("2x16"), peer.get("2x16"), 1.2, False),
        ("Claims with every limit set (none binding): ms per job against none",
         1000 / flow["every_limit"], 1000 / flow["off"], 1.1, True),
        ("CPU-bound handler, --processes 2 against one process of two threads",
         processes[0] if processes else None, threads[0] if threads else None, 1.7, False),
        ("Idle pickup p50 (ms), against the best peer's",
         latency.get(OURS, {}).get("p50_ms"), best_peer, 1.0, True),
        ("Enqueue one by one", enqueue.get(OURS), enqueue.get("pgqueuer"), 1.0, False),
        ("`run_jobs --burst` start-up on an empty queue (s), against 0.5 s", startup, 0.5, 1.0,
         True),
    ]  # fmt: skip
    return [
        {
            "what": what,
            "ours": value,
            "against": against,
            "ratio": value / against,
            "goal": f"{'≤' if at_most else '≥'} {goal:g}",
            "holds": value / against <= goal if at_most else value / against >= goal,
        }
        for what, value, against, goal, at_most in wanted
        if value and against
    ]


def _load_of(document: Document) -> str:
    load = document.get("burn", {}).get("load_average", {}).get("start")
    return ", ".join(f"{x:g}" for x in load) if load else "not recorded"


def worker_targets_table(document: Document) -> str:
    """The worker's targets, then our burn-down set-ups beside the defaults."""
    rows = [
        [
            r["what"],
            _num(r["ours"], 2),
            _num(r["against"], 2),
            f"{r['ratio']:.2f}",
            r["goal"],
            "holds" if r["holds"] else "misses",
        ]
        for r in document["rows"]
    ]
    extra = sorted(document["burn"]["median"].get(OURS, {}).items())
    burner = " A CPU burner kept one core busy throughout." if document.get("cpu_burner") else ""
    return "\n\n".join(
        [
            f"Load average at the start of the burn-downs: {_load_of(document)}.{burner}",
            table(["target", "django-ledon", "against", "ratio", "goal", "verdict"], rows),
            table(["our set-up", "jobs/s (median)"], [[f"`{k}`", _num(v)] for k, v in extra]),
        ]
    )


#: What ``--only`` prints of each part's figures.
ONLY: dict[str, Callable[[dict[str, Any]], str]] = {
    "flow-control": lambda part: flow_table({"flow_control": part}),
    "burn-down": lambda part: json.dumps(
        {key: part[key] for key in ("median", "ours_over", "sleep5_of_ideal")}
    ),
    "bulk": lambda part: bulk_table(part),
    "cpu": lambda part: cpu_table({"systems": {OURS: part["median"]}}),
    "profile": lambda part: profile_section(part) + "\n\n" + cpu_parts_table(part),
    "fair-share": lambda part: fair_table(part),
    "outbox": lambda part: outbox_order_table({"outbox_order": part}),
    "ordering": lambda part: ordering_table(part),
    "start-up": lambda part: startup_line({"startup": part}),
    "targets": worker_targets_table,
}


def targets_table(document: Document) -> str:
    rows = [
        [target, measured, "n/a" if holds is None else ("yes" if holds else "**no**")]
        for target, measured, holds in targets(document)
    ]
    return table(["Target", "Measured", "Holds"], rows)


# --------------------------------------------------------------------------- the page

#: The report's sections: (title, the table's function).
SECTIONS: tuple[tuple[str, Callable[[Document], str]], ...] = (
    ("Throughput", throughput_table),
    ("A CPU-bound handler: processes against threads", cpu_table),
    ("Idle pickup latency", latency_table),
    ("Claim cost with a long history", claim_table),
    ("The server's limits: the floor and the commit rate", floor_table),
    ("Scale-out: worker processes against one server", scale_table),
    ("What each job costs the server", per_job_table),
    ("Where one job's time goes", profile_section),
    ("The worker's CPU per job, by part", cpu_parts_table),
    ("Start-up", startup_line),
    ("A realistic handler", sleep_table),
    ("Asynchronous commit (opt-in)", syncmode_table),
    ("Claim cost with a deep queue", queued_table),
    ("Flow control", flow_table),
    ("Outbox and sagas", extras_section),
    ("Ordered outbox delivery", outbox_order_table),
    ("Against another commit", compare_table),
    ("Targets", targets_table),
)

#: What the marks in the throughput table mean.
LEGEND = (
    "† one task at a time per process (django-tasks-db's `db_worker`): its figure for the"
    " same number of processes. ‡ pgqueuer with its defaults (batches of 10, no"
    " concurrency cap) in every row with that process count."
)


def header(document: Document) -> str:
    """The run: when, where, which versions, how many jobs."""
    env, plan, systems = document["environment"], document["plan"], document["systems"]
    pg = env["postgresql"]
    names = _systems(document)

    def jobs(prefix: str) -> str:
        counts = {
            n: systems[n][k]["jobs"]
            for n in names
            for k in systems[n]
            if k.startswith(prefix) and "jobs" in systems[n][k]
        }
        return ", ".join(f"{n} {count:,}" for n, count in counts.items()) or "—"

    rows = [
        ["Date", env["date"]],
        ["Machine", f"{env['cpus']} CPUs, {env['platform']}, Python {env['python']}"],
        [
            "PostgreSQL",
            f"{pg.get('server_version')}, fsync={pg.get('fsync')},"
            f" synchronous_commit={pg.get('synchronous_commit')},"
            f" full_page_writes={pg.get('full_page_writes')}",
        ],
        [
            "Load average (1, 5, 15 min), start → end",
            f"{env.get('load_average', '?')} → {env.get('load_average_end', '?')}",
        ],
        ["Versions", ", ".join(f"{n} {systems[n].get('version', '?')}" for n in names)],
        ["Runs per figure (the median)", plan["runs"]],
        ["Jobs: enqueue one by one", jobs("enqueue_each")],
        ["Jobs: burn-down (no-op)", jobs("burn_")],
    ]
    skipped = document.get("skipped") or {}
    if skipped:
        rows.append(["Not measured", ", ".join(f"{k} ({v})" for k, v in skipped.items())])
    if not document.get("statements_measured", True):
        rows.append(["Statements per job", "not measured (no `pg_stat_statements`)"])
    return table(["Run", ""], rows)


def render(document: Document) -> str:
    """The whole report: the run, then one table per section."""
    parts = [
        "# Benchmark results",
        "",
        "<!-- Generated by `make bench` (python -m benchmarks); edit benchmarks/report.py,"
        " not this file. What the figures mean: benchmarks.md. -->",
        "",
        header(document),
    ]
    for title, section in SECTIONS:
        parts += ["", f"## {title}", "", section(document)]
        if section is throughput_table:
            parts += ["", LEGEND]
    return "\n".join(parts).rstrip() + "\n"


def summary_table(document: Document) -> str:
    """What a run prints at its end."""
    tables = (throughput_table, latency_table, claim_table, flow_table, targets_table)
    return "\n\n".join(section(document) for section in tables)
