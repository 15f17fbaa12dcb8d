"""The results of a run as Markdown tables (``docs/benchmark-results.md``): every
measurement, the ratios against the peers and a verdict per target. Tables only: what
the figures mean is written by hand in ``docs/benchmarks.md``."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from .systems import OURS, PEERS

#: (key in the results, row label)
THROUGHPUT_ROWS = [
    ("enqueue_each", "Enqueue, one call (and commit) per job"),
    ("enqueue_bulk", "Enqueue, bulk API"),
]
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


#: (target, measured, holds: None when not measured)
Target = tuple[str, str, bool | None]


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
    concurrency = document["plan"].get("sleep_concurrency")
    if concurrency:
        values, flags = {}, {}
        for n in names:
            values[n], flags[n] = _burn(systems[n], 1, concurrency, "sleep5")
        if any(values.values()):
            row(f"Burn-down, 5 ms handler, 1 process, concurrency {concurrency}", values, flags)
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


def bulk_table(bulk: dict[str, Any]) -> str:
    """The table of ``--only bulk``: jobs/s (median) and per job WAL and statements,
    with each system's rate as a multiple of django-ledon's."""
    ours = bulk["median"].get(OURS)
    lines = [
        f"Bulk enqueue of {bulk['jobs']:,} jobs, medians of"
        f" {len(next(iter(bulk['runs'].values())))}"
        " interleaved rounds",
        "",
        "| System | Jobs/s | django-ledon ÷ system | µs/job | server µs/job | WAL bytes/job"
        " | Statements/job |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, rate in bulk["median"].items():
        cost = bulk["per_job"].get(name, {})
        ratio = f"{ours / rate:.2f}×" if ours and rate else "—"
        statements = cost.get("statements")
        lines.append(
            f"| {name} | {_num(rate)} | {ratio} | {_num(1e6 / rate if rate else None, 1)} |"
            f" {_num(cost.get('server_us'), 1)} | {_num(cost.get('wal_bytes'))} |"
            f" {'—' if statements is None else f'{statements:.4f}'} |"
        )
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


def _rate(document: dict[str, Any], system: str, key: str) -> float | None:
    return _median(document["systems"].get(system, {}), key)


def floor_table(document: dict[str, Any]) -> str:
    ours = document["systems"].get(OURS, {})
    floor, c1 = _median(ours, "floor"), _burn(ours, 1, 1)[0]
    if floor is None:
        return "_Not measured in this run._"
    commits = sorted(
        (int(k.split("_")[1]), v["median"]) for k, v in ours.items() if k.startswith("commit_")
    )
    tool = ours.get("commits_measured_with") or "pgbench"
    lines = ["| Measurement | per second | ms each |", "|---|---|---|"]
    lines.append(
        f"| Floor: our finish-and-claim statement back to back, one connection"
        f" ({ours['floor']['jobs']:,} jobs) | {_num(floor)} | {1000 / floor:.2f} |"
    )
    for clients, tps in commits:
        noun = "client" if clients == 1 else "clients"
        lines.append(
            f"| One-row `UPDATE` commits, {clients} {noun} ({tool}) | {_num(tps)}"
            f" | {1000 / tps * clients:.2f} |"
        )
    if c1:
        lines.append(f"| Our worker, 1 process, concurrency 1 | {_num(c1)} | {1000 / c1:.2f} |")
    return "\n".join(lines)


def scale_table(document: dict[str, Any]) -> str:
    ours = document["systems"].get(OURS, {})
    keys = sorted(
        (k for k in ours if k.startswith("scale_")), key=lambda k: int(k[6:].split("p")[0])
    )
    if not keys:
        return "_Not measured in this run._"
    locks = ours.get("locks_during_scale", {})
    costs = ours.get("per_job", {})
    lines = [
        "| Worker processes × concurrency | jobs/s | vs 1 process | CPUs busy"
        " | backends waiting on a lock (mean / most) | ungranted locks (mean)"
        " | backends active (mean) | commonest waits | who waited for whom (samples) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    first = ours[keys[0]]["median"]
    for key in keys:
        setup = key[6:]
        processes, concurrency = setup.split("p-c")
        lock = locks.get(setup, {})
        events = ", ".join(f"{k} {v}" for k, v in list(lock.get("wait_events", {}).items())[:3])
        waits = ", ".join(f"{k} {v}" for k, v in list(lock.get("waits_for", {}).items())[:2])
        lines.append(
            f"| {processes} × {concurrency} | {_num(ours[key]['median'])}"
            f" | {ours[key]['median'] / first:.2f} | {_cpus(costs.get(setup, {}))} |"
            f" {lock.get('mean_waiting_on_lock', 0):.2f}"
            f" / {lock.get('most_waiting_on_lock', 0):.0f}"
            f" | {lock.get('mean_ungranted_locks', 0):.2f} | {lock.get('mean_active', 0):.1f}"
            f" | {events or '—'} | {waits or '—'} |"
        )
    return "\n".join(lines)


#: The burn-downs other than the no-op ones, by the variant their per-job costs carry.
_VARIANTS = {
    "sleep5": "5 ms handler",
    "async": "`ASYNCHRONOUS_COMMIT`",
    "sleep5-async": "5 ms handler, `ASYNCHRONOUS_COMMIT`",
}


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


def _round_trips_of(
    document: dict[str, Any], system: str, key: str, cost: dict[str, Any]
) -> float | None:
    """:func:`_round_trips` of a per-job costs' entry of ``document``."""
    return _round_trips(system, key, cost, _jobs_of(document, system, key, cost))


def _jobs_of(document: dict[str, Any], system: str, key: str, cost: dict[str, Any]) -> int:
    """The jobs of the burn-downs behind a per-job costs' entry (recorded since the
    entries carry it; before, the plan's count for that kind of burn-down)."""
    if "jobs" in cost:
        return int(cost["jobs"])
    plan = document["plan"]
    if "sleep5" in key:
        return int(plan["sleep_jobs"])
    if key.split("/")[0].endswith(f"-c{plan.get('scale_concurrency')}"):
        return int(plan["scale_jobs"])
    if "limits-" in key:
        return int(plan["flow_burn_jobs"])
    burn = plan["burn_jobs"]
    return int(burn.get(system, burn["default"]))


def per_job_table(document: dict[str, Any]) -> str:
    systems = document["systems"]
    lines = [
        "| System | Set-up (processes × concurrency) | Statements per job | Round trips per job"
        " | WAL bytes per job | Worker CPU ms per job | CPUs busy |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in _systems(document):
        costs = systems[name].get("per_job", {})
        for key in sorted(costs, key=_parse_key):
            cost = costs[key]
            lines.append(
                f"| {name} | {_setup(key)} | {_num(cost.get('statements'), 2)}"
                f" | {_num(_round_trips_of(document, name, key, cost), 2)}"
                f" | {_num(cost.get('wal_bytes'))} | {_num(cost.get('worker_cpu_ms'), 3)}"
                f" | {_cpus(cost)} |"
            )
    return "\n".join(lines) if len(lines) > 2 else "_Not measured in this run._"


def sleep_line(document: dict[str, Any]) -> tuple[float, float, int] | None:
    ours = document["systems"].get(OURS, {})
    key = next((k for k in ours if k.startswith("sleep5_")), None)
    if key is None:
        return None
    concurrency = int(key.rsplit("-c", 1)[1])
    return ours[key]["median"], concurrency / 0.005, concurrency


def queued_table(document: dict[str, Any]) -> str:
    cost = document.get("queued_claim_cost")
    if not cost:
        return "_Not measured in this run._"
    lines = [
        f"| Measurement | {cost['shallow_rows']:,} queued | {cost['deep_rows']:,} queued"
        " | Cost ratio |",
        "|---|---|---|---|",
    ]
    phases = [("right after a checkpoint", cost["shallow"], cost["deep"])]
    if "steady" in cost["deep"]:
        warm = f"after {cost['warm_claims']:,} claims since the checkpoint"
        phases.append((warm, cost["shallow"]["steady"], cost["deep"]["steady"]))
    for phase, shallow, deep in phases:
        for label, key, digits in (
            ("One claim of 1 job (ms, median)", "claim_1_ms", 2),
            ("One claim of 16 jobs (ms, median)", "claim_16_ms", 2),
            ("Server execution per claimed job (ms)", "server_ms_per_job", 3),
            ("WAL per claimed job (bytes)", "wal_bytes_per_job", 0),
        ):
            if key not in shallow or key not in deep:
                continue
            ratio = deep[key] / shallow[key] if shallow[key] else float("nan")
            lines.append(
                f"| {label}, {phase} | {_num(shallow[key], digits)}"
                f" | {_num(deep[key], digits)} | {ratio:.2f} |"
            )
    return "\n".join(lines)


def _at_least(label: str, ours: float, theirs: float, goal: float, unit: str = "") -> Target:
    """A target that ``ours ÷ theirs`` reaches ``goal``."""
    ratio = ours / theirs
    return (label, f"{ours:,.0f} ÷ {theirs:,.0f} = {ratio:.2f}{unit}", ratio >= goal)


def physical_targets(document: dict[str, Any]) -> list[Target]:
    """(target, measured, holds) for the targets read against the server's limits."""
    systems = document["systems"]
    ours = systems.get(OURS, {})
    pgq = systems.get("pgqueuer", {})
    out: list[Target] = []
    c1, floor, one = _burn(ours, 1, 1)[0], _median(ours, "floor"), _median(ours, "commit_1")
    goal = TARGETS["floor_fraction_c1"]
    if c1 and floor:
        out.append(_at_least(f"Concurrency 1 ≥ {goal:g} of the floor loop", c1, floor, goal))
    goal = TARGETS["commit_fraction_c1"]
    if c1 and one:
        label = f"Concurrency 1 ≥ {goal:g} of the one-row commit rate"
        out.append(_at_least(label, c1, one, goal))
    for concurrency, target in ((4, "c4_pgqueuer"), (16, "c16_pgqueuer")):
        a, b = _burn(ours, 1, concurrency)[0], _burn(pgq, 1, concurrency)[0]
        goal = TARGETS[target]
        if a and b:
            out.append(
                _at_least(f"Concurrency {concurrency} ≥ {goal:g}× pgqueuer", a, b, goal, "×")
            )
    scale = [(p, ours[f"scale_{p}p-c{c}"]["median"]) for p, c in _scale_setups(ours)]
    if len(scale) > 1:
        never = all(b >= a for (_, a), (_, b) in itertools.pairwise(scale))
        measured = ", ".join(f"{p}p: {r:,.0f}" for p, r in scale)
        out.append(("Scale-out: throughput never falls as processes are added", measured, never))
    bulk, peer = _median(ours, "enqueue_bulk"), _median(pgq, "enqueue_bulk")
    goal = TARGETS["bulk_pgqueuer"]
    if bulk and peer:
        out.append(_at_least(f"Bulk submit ≥ {goal:g}× pgqueuer's bulk", bulk, peer, goal, "×"))
    sleep = sleep_line(document)
    if sleep:
        rate, ideal, concurrency = sleep
        goal = TARGETS["sleep5_ideal"]
        label = f"5 ms handler at concurrency {concurrency} ≥ {goal:.0%} of the ideal"
        out.append(_at_least(label, rate, ideal, goal))
    queued = document.get("queued_claim_cost")
    if queued:
        goal = TARGETS["queued_cost_ratio"]
        measured = (
            f"claim of 1: {queued['ratio_claim_1']:.2f}, claim of 16:"
            f" {queued['ratio_claim_16']:.2f}"
        )
        worst = max(queued["ratio_claim_1"], queued["ratio_claim_16"])
        if "steady_ratio_claim_1" in queued:
            # The target reads the steady phase: the cold one adds the page images a
            # checkpoint cycle writes once per page (see the deep-queue section).
            measured = (
                f"steady: claim of 1 {queued['steady_ratio_claim_1']:.2f}, claim of 16"
                f" {queued['steady_ratio_claim_16']:.2f}; right after a checkpoint: " + measured
            )
            worst = max(queued["steady_ratio_claim_1"], queued["steady_ratio_claim_16"])
        out.append(
            (
                f"Claim cost with {queued['deep_rows']:,} queued ≤ {goal:g}×"
                f" {queued['shallow_rows']:,} queued",
                measured,
                worst <= goal,
            )
        )
    return out


_PARTS = (
    (
        "python_around_statement_ms",
        "Python around the statement (arguments, parameters, rows back into claims)",
    ),
    ("round_trip_ms", "Round trip (network, protocol, bind; the statement less the two below)"),
    ("server_execution_ms", "Server execution of the statement (`pg_stat_statements`)"),
    ("commit_wal_flush_ms", "Commit: the WAL flush (`pg_stat_wal` sync time)"),
    ("handoff_and_handler_ms", "Hand-off to the handler and the handler (`run_attempt`)"),
    ("return_to_next_statement_ms", "Return to the next statement (the worker's book-keeping)"),
)


def profile_section(document: dict[str, Any]) -> str:
    prof = document.get("profile")
    if not prof:
        return "_Not measured in this run._"
    levels = [k for k in ("c1", "c4") if k in prof]
    head = " | ".join(f"concurrency {k[1:]}" for k in levels)
    lines = [f"| ms per job | {head} |", "|---|" + "---|" * len(levels)]
    for key, label in _PARTS:
        cells = [_num(prof[k].get(key), 3) for k in levels]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines.append(
        "| **Wall time per job** | "
        + " | ".join(f"**{prof[k]['wall_ms_per_job']:.3f}**" for k in levels)
        + " |"
    )
    lines.append(
        "| Statements per job; WAL syncs per job | "
        + " | ".join(
            f"{prof[k]['statements_per_job']:.2f}; {prof[k]['wal_syncs_per_job']:.2f}"
            for k in levels
        )
        + " |"
    )
    lines.append(
        "| One WAL sync (ms) | "
        + " | ".join(f"{prof[k]['wal_sync_ms']:.3f}" for k in levels)
        + " |"
    )
    pad = " |" * (len(levels) - 1)
    lines.append(f"| For scale: a prepared `SELECT 1` (ms) | {prof['round_trip_ms']:.3f}{pad} |")
    explain = prof.get("explain", {})
    if explain:
        lines.append(
            "| `EXPLAIN (ANALYZE, BUFFERS, WAL)` of one finish-and-claim: ms executing;"
            f" buffers hit; WAL records; WAL bytes | {explain.get('execution_ms')};"
            f" {explain.get('shared_hit_blocks')}; {explain.get('wal_records')};"
            f" {explain.get('wal_bytes')}{pad} |"
        )
    out = ["\n".join(lines)]
    c1 = prof.get("c1")
    if c1 and c1.get("top"):
        out += [
            "",
            "| Costliest functions at concurrency 1 (cProfile, own time) | calls per job"
            " | own µs per job |",
            "|---|---|---|",
        ]
        for row in c1["top"][:8]:
            out.append(
                f"| `{row['function']}` | {row['calls_per_job']:.2f}"
                f" | {row['own_us_per_job']:.0f} |"
            )
    return "\n".join(out)


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
    for target, measured, holds in [*physical_targets(document), *targets(document)]:
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


def syncmode_table(document: dict[str, Any]) -> str:
    """``JOBS["ASYNCHRONOUS_COMMIT"]`` off and on, measured one right after the other."""
    ours = document["systems"].get(OURS, {})
    names = sorted(
        {k[len("syncmode_") :].rsplit("_", 1)[0] for k in ours if k.startswith("syncmode_")}
    )
    if not names:
        return "_Not measured in this run._"
    lines = [
        "| Burn-down (jobs/s, median) | durable commits (default) | `ASYNCHRONOUS_COMMIT` |"
        " async ÷ durable |",
        "|---|---|---|---|",
    ]
    for name in names:
        durable = _median(ours, f"syncmode_{name}_durable")
        fast = _median(ours, f"syncmode_{name}_async")
        label = (
            "1 worker process, concurrency 1, no-op handler"
            if name == "c1"
            else f"1 worker process, concurrency {name.rsplit('_c', 1)[1]}, 5 ms handler"
        )
        lines.append(f"| {label} | {_num(durable)} | {_num(fast)} | {_ratio(fast, durable)} |")
    return "\n".join(lines)


def sleep_table(document: dict[str, Any]) -> str:
    """django-ledon's 5 ms handler against the ideal rate, and where a handler slot's
    time went (``benchmarks/profiling.py``)."""
    sleep = sleep_line(document)
    if sleep is None:
        return "_Not measured in this run._"
    rate, ideal, concurrency = sleep
    lines = [
        "| Measurement | Value |",
        "|---|---|",
        f"| 5 ms handler, 1 worker process, concurrency {concurrency} (jobs/s) | {_num(rate)} |",
        f"| The ideal: {concurrency} handlers each finishing 200 jobs a second | {_num(ideal)} |",
        f"| Share of the ideal | {rate / ideal:.0%} |",
    ]
    slot = document.get("slot_profile")
    if slot:
        parts = [
            ("the handler (`run_attempt`: the 5 ms sleep and its call)", "handler_ms"),
            ("waiting for the settle under way", "wait_for_settle_ms"),
            ("its own settle (finish and claim, one statement and its commit)", "settle_ms"),
            ("hand-off of the new claim to a handler thread", "handoff_ms"),
        ]
        turn = sum(slot[key] for _, key in parts)
        lines += [
            f"| Profiled ({slot['jobs']:,} jobs, concurrency {slot['concurrency']}): jobs/s"
            f" | {_num(slot['jobs_per_s'])} |",
            *(f"| A slot's turn, ms: {label} | {slot[key]:.2f} |" for label, key in parts),
            f"| A slot's turn, ms: **all of it** | **{turn:.2f}** |",
            f"| Jobs per settle; one WAL sync (ms) | {slot['jobs_per_settle']:.1f};"
            f" {slot['wal_sync_ms']:.2f} |",
        ]
    return "\n".join(lines)


def cpu_table(document: dict[str, Any]) -> str:
    """The CPU-bound handler (pure Python for about 20 ms) run by one worker process
    and by ``run_jobs --processes``, the same handler threads in all."""
    ours = document["systems"].get(OURS, {})
    keys = sorted(k for k in ours if k.startswith("cpu20_"))
    if not keys:
        return "_Not measured in this run._"
    single = next((ours[k]["median"] for k in keys if "x" not in k), None)
    lines = [
        "| Set-up (same handler threads in all) | jobs/s (median) | ÷ one process |",
        "|---|---|---|",
    ]
    for key in keys:
        setup = key[len("cpu20_") :]
        if "x" in setup:
            processes, concurrency = setup.split("x-c")
            label = f"`run_jobs --processes {processes} --concurrency {concurrency}`"
        else:
            processes, concurrency = setup.split("p-c")
            label = f"one worker process, `--concurrency {concurrency}`"
        rate = ours[key]["median"]
        lines.append(f"| {label} | {_num(rate)} | {_ratio(rate, single)} |")
    return "\n".join(lines)


def compare_table(document: dict[str, Any]) -> str:
    """``--compare REV``: the same burn-downs of this tree and of another commit,
    interleaved: jobs/s, the workers' CPU (user and system, every worker process) and
    the statements per job, and this tree's figure over the other's."""
    compare = document.get("compare")
    if not compare:
        return "_Not measured in this run._"
    names = list(compare["median"])
    this, other = names[0], names[1]
    head = (
        "| Burn-down | Figure | " + " | ".join(f"`{n}`" for n in names) + f" | {this} ÷ {other} |"
    )
    lines = [head, "|---|---|---|---|---|"]
    for setup in compare["setups"]:
        for label, field, digits in (
            ("jobs/s", "jobs_per_s", 0),
            ("worker CPU ms per job", "cpu_ms_per_job", 3),
            ("statements per job", "statements", 2),
        ):
            values = [compare["median"][n].get(setup, {}).get(field) for n in names]
            ratio = f"{values[0] / values[1]:.2f}" if values[0] and values[1] else "—"
            cells = " | ".join(_num(v, digits) for v in values)
            lines.append(f"| {setup} | {label} | {cells} | {ratio} |")
    return "\n".join(lines)


#: The report's sections: (title, the table's function).
SECTIONS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("Throughput", throughput_table),
    ("A CPU-bound handler: processes against threads", cpu_table),
    ("Idle pickup latency", latency_table),
    ("Claim cost with a long history", claim_table),
    ("The server's limits: the floor and the commit rate", floor_table),
    ("Scale-out: worker processes against one server", scale_table),
    ("What each job costs the server", per_job_table),
    ("Where one job's time goes", profile_section),
    ("A realistic handler", sleep_table),
    ("Asynchronous commit (opt-in)", syncmode_table),
    ("Claim cost with a deep queue", queued_table),
    ("Flow control", flow_table),
    ("Outbox and sagas", extras_section),
    ("Against another commit", compare_table),
    ("Targets", targets_table),
)

#: What the marks in the throughput table mean.
LEGEND = (
    "† one task at a time per process (django-tasks-db's `db_worker`): its figure for the"
    " same number of processes. ‡ pgqueuer with its defaults (batches of 10, no"
    " concurrency cap) in every row with that process count."
)


def header(document: dict[str, Any]) -> str:
    """The run: when, where, which versions, how many jobs."""
    env, plan, systems = document["environment"], document["plan"], document["systems"]
    pg = env["postgresql"]
    versions = ", ".join(f"{n} {systems[n].get('version', '?')}" for n in _systems(document))
    rows = [
        ("Date", env["date"]),
        ("Machine", f"{env['cpus']} CPUs, {env['platform']}, Python {env['python']}"),
        (
            "PostgreSQL",
            f"{pg.get('server_version')}, fsync={pg.get('fsync')},"
            f" synchronous_commit={pg.get('synchronous_commit')},"
            f" full_page_writes={pg.get('full_page_writes')}",
        ),
        (
            "Load average (1, 5, 15 min), start → end",
            f"{env.get('load_average', '?')} → {env.get('load_average_end', '?')}",
        ),
        ("Versions", versions),
        ("Runs per figure (the median)", str(plan["runs"])),
    ]
    skipped = document.get("skipped") or {}
    if skipped:
        rows.append(("Not measured", ", ".join(f"{k} ({v})" for k, v in skipped.items())))
    if not document.get("statements_measured", True):
        rows.append(("Statements per job", "not measured (no `pg_stat_statements`)"))
    lines = ["| Run | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(lines)


def render(document: dict[str, Any]) -> str:
    """The whole report: the run, then one table per section."""
    parts = [
        "# Benchmark results",
        "",
        "<!-- Generated by `make bench` (python -m benchmarks); edit benchmarks/report.py,"
        " not this file. What the figures mean: benchmarks.md. -->",
        "",
        header(document),
    ]
    for title, table in SECTIONS:
        parts += ["", f"## {title}", "", table(document)]
        if table is throughput_table:
            parts += ["", LEGEND]
    return "\n".join(parts).rstrip() + "\n"
