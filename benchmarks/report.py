"""The Markdown report (``docs/benchmarks.md``) rendered from a run's raw results."""

from __future__ import annotations

import itertools
import math
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
        one = dict(commits).get(1)
        lines += [
            "",
            f"Our worker at concurrency 1 runs at **{c1 / floor:.2f}** of the floor"
            + (f" and **{c1 / one:.2f}** of the one-client commit rate." if one else "."),
        ]
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
        " | WAL bytes per job | CPUs busy |",
        "|---|---|---|---|---|---|",
    ]
    for name in _systems(document):
        costs = systems[name].get("per_job", {})
        for key in sorted(costs, key=_parse_key):
            cost = costs[key]
            lines.append(
                f"| {name} | {_setup(key)} | {_num(cost.get('statements'), 2)}"
                f" | {_num(_round_trips_of(document, name, key, cost), 2)}"
                f" | {_num(cost.get('wal_bytes'))} | {_cpus(cost)} |"
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
    explain = prof.get("explain", {})
    out = ["\n".join(lines), ""]
    out.append(
        f"For scale: a prepared `SELECT 1` takes {prof['round_trip_ms']:.3f} ms (median)."
        + (
            f" `EXPLAIN (ANALYZE, BUFFERS, WAL)` of the statement finishing one attempt and"
            f" claiming one job: {explain.get('execution_ms')} ms executing,"
            f" {explain.get('shared_hit_blocks')} buffers hit,"
            f" {explain.get('wal_records')} WAL records, {explain.get('wal_bytes')} WAL bytes."
            if explain
            else ""
        )
    )
    c1 = prof.get("c1")
    if c1 and c1.get("top"):
        out += [
            "",
            "The worker's costliest functions at concurrency 1 (cProfile, own time):",
            "",
            "| Function | calls per job | own µs per job |",
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
        + (
            f" Load average (1, 5, 15 min) when the run began: {env['load_average']},"
            f" when it ended: {env.get('load_average_end', '?')} — the machine was shared"
            " with other work, which makes absolute figures noisy; ratios measured"
            " minutes apart are what to read."
            if "load_average" in env
            else ""
        )
        + f" Versions: {versions}."
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
        "## The server's limits: the floor and the commit rate",
        "",
        "Measured in each run right after django-ledon's burn-downs, on the same server."
        " The floor is our own finish-and-claim statement (built by the store's"
        " builders) run back to back from one psycopg connection, prepared, in"
        " autocommit, with no worker around it: each statement finishes the job the"
        " previous one claimed and claims the next, which is what a worker at concurrency 1"
        " does once per job. The commit rate is durable one-row `UPDATE` transactions,"
        " each client on its own row.",
        "",
        floor_table(document),
        "",
        "## Scale-out: worker processes against one server",
        "",
        "Burn-downs of django-ledon by more and more worker processes, each at the same"
        " concurrency. Meanwhile the harness samples `pg_stat_activity` (backends whose"
        " `wait_event_type` is `Lock`, and the commonest wait events of active backends),"
        " `pg_locks` (locks not granted) and, for each waiting backend,"
        " `pg_blocking_pids` (which statement waited for which: *waiter ← blocker*,"
        " counted per sample) every 20 ms. CPUs busy: the machine's busy CPU time"
        " (`/proc/stat`: the server's and the workers' processes alike) over the"
        " burn-down's time, of the machine's CPUs.",
        "",
        scale_table(document),
        "",
        "## What each job costs the server",
        "",
        "Per job of a burn-down: the statements the system's processes sent"
        " (`pg_stat_statements`, top level, `BEGIN`/`COMMIT` included, the harness's own"
        " polls left out) and the round trips among them — all but the server's own"
        " foreign-key checks (`SELECT 1 FROM ONLY … FOR KEY SHARE`, which PostgreSQL runs"
        " inside a statement that inserts a row referring to another) and, for"
        " django-ledon with `ASYNCHRONOUS_COMMIT`, the `set_config` sent in one pipeline"
        " with the statement it applies to —; and the"
        " WAL written (`pg_current_wal_lsn` before and after, less the WAL of the same"
        " enqueue measured alone), and the machine's CPUs busy meanwhile. Besides the"
        " no-op burn-downs, django-ledon's 5 ms handler and its `ASYNCHRONOUS_COMMIT`"
        " runs have rows of their own."
        + (
            ""
            if document.get("statements_measured", True)
            else " `pg_stat_statements` was not loaded on this server: statements not measured."
        ),
        "",
        per_job_table(document),
        "",
        "## Where one job's time goes",
        "",
        "`benchmarks/profiling.py`: a worker run in the harness's process over"
        f" {document.get('profile', {}).get('jobs', 0):,} queued no-op jobs, its parts timed"
        " (a wrapper around each; at concurrency 4 the parts overlap on several threads, so"
        " they add up to more than the wall time), the server's side read from"
        " `pg_stat_statements` and `pg_stat_wal`, and a second run under cProfile for the"
        " functions that cost the most.",
        "",
        profile_section(document),
        "",
        "## A realistic handler",
        "",
        _sleep_text(document),
        "",
        "## Asynchronous commit (opt-in)",
        "",
        "django-ledon only: the same burn-downs with the worker's claims and finishes"
        ' committed durably (the default) and with `JOBS["ASYNCHRONOUS_COMMIT"]`'
        " (`synchronous_commit = off` for those transactions; a database crash can then"
        " lose the last few hundred milliseconds of them, and those jobs run again — see"
        " [asynchronous commit](workers.md#asynchronous-commit)), one right after the"
        " other in each run.",
        "",
        syncmode_table(document),
        "",
        "## Claim cost with a deep queue",
        "",
        "django-ledon only: the same claims with a shallow and with a deep queue of due"
        " jobs, loaded straight into the table.",
        "",
        queued_table(document),
        "",
        "## Flow control",
        "",
        "django-ledon only: the burn-down of one worker process at concurrency 16 with"
        " queue limits (J18) that never bind there, against none — what keeping the"
        " limits costs each claim (the advisory locks and one statement that counts,"
        " picks and claims, in the round trip of a claim without limits; with `rate` a"
        " row per start, and the starts in its window counted). Slowdown = jobs/s"
        " without ÷ jobs/s with.",
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
        "## What holds, and what stops the rest",
        "",
        closing_note(document),
        "",
        METHOD,
    ]
    return "\n".join(parts).rstrip() + "\n"


def closing_note(document: dict[str, Any]) -> str:
    """The figures of the issue's targets in words, from this run, with the physical
    cost that stops a target that does not hold."""
    systems = document["systems"]
    ours = systems.get(OURS, {})
    pgq = systems.get("pgqueuer", {})
    verdicts = {t: (m, h) for t, m, h in physical_targets(document)}
    held = [t for t, (_, h) in verdicts.items() if h]
    missed = [t for t, (_, h) in verdicts.items() if h is False]
    lines = [
        f"Of the {len(verdicts)} targets read against the server's limits, {len(held)}"
        f" hold: {'; '.join(held) or 'none'}."
        + (f" Not held: {'; '.join(missed)}." if missed else ""),
        "",
    ]
    c1, floor = _burn(ours, 1, 1)[0], _median(ours, "floor")
    one = _median(ours, "commit_1")
    prof = document.get("profile", {}).get("c1", {})
    if c1 and floor and one:
        text = (
            f"- **Concurrency 1**: {c1:,.0f} jobs/s, {c1 / floor:.2f} of the floor"
            f" ({floor:,.0f}/s, {1000 / floor:.2f} ms a statement) and {c1 / one:.2f} of"
            f" the one-row commit rate ({one:,.0f}/s, {1000 / one:.2f} ms a commit). The"
            f" floor itself is {floor / one:.2f} of the commit rate: with no worker"
            " around it, our finish-and-claim statement costs more than a one-row commit"
            " because it does more — per job it finishes an attempt and its job, claims"
            " the next job and inserts its attempt row, one commit for all of it (J8, J6,"
            " J14)."
        )
        runs = list(zip(ours["burn_1p-c1"]["runs"], ours["floor"]["runs"], strict=False))
        if len(runs) > 1:
            text += (
                " Run by run, concurrency 1 ÷ floor: "
                + ", ".join(f"{a / b:.2f}" for a, b in runs)
                + "."
            )
        if prof:
            text += (
                f" In the profile, one job at concurrency 1 took"
                f" {prof['wall_ms_per_job']:.3f} ms: the commit's WAL flush"
                f" {prof['commit_wal_flush_ms']:.3f}, the server's execution"
                f" {prof['server_execution_ms']:.3f}, the round trip"
                f" {prof['round_trip_ms']:.3f}, the Python around the statement"
                f" {prof['python_around_statement_ms']:.3f}, the hand-off and handler"
                f" {prof['handoff_and_handler_ms']:.3f} and the rest of the worker"
                f" {prof['return_to_next_statement_ms'] or 0:.3f}."
            )
        durable, fast = _median(ours, "syncmode_c1_durable"), _median(ours, "syncmode_c1_async")
        if durable and fast:
            text += (
                f" With `ASYNCHRONOUS_COMMIT` the worker waits for no WAL flush: {fast:,.0f}"
                f" against {durable:,.0f} jobs/s measured beside it ({fast / durable:.2f}×),"
                f" {fast / one:.2f} of the one-row commit rate."
            )
        lines.append(text)
    costs = ours.get("per_job", {})
    peer_costs = pgq.get("per_job", {})
    for concurrency in (4, 16):
        a, b = _burn(ours, 1, concurrency)[0], _burn(pgq, 1, concurrency)[0]
        if not (a and b):
            continue
        text = (
            f"- **Concurrency {concurrency}**: {a:,.0f} against pgqueuer's {b:,.0f} jobs/s"
            f" ({a / b:.2f}×)."
        )
        key = f"1p-c{concurrency}"
        mine, theirs = costs.get(key, {}), peer_costs.get("1p-c0", {})
        if mine.get("wal_bytes") and theirs.get("wal_bytes"):
            trips = _round_trips_of(document, OURS, key, mine)
            peer_trips = _round_trips_of(document, "pgqueuer", "1p-c0", theirs)
            text += (
                f" Per job we write {mine['wal_bytes']:,.0f} bytes of WAL to pgqueuer's"
                f" {theirs['wal_bytes']:,.0f}: the attempt row (inserted, then finished) and"
                " the token, lease and history the contract keeps, which pgqueuer does not"
                + (
                    f"; and we make {trips:.2f} round trips a job to its {peer_trips:.2f}."
                    if trips is not None and peer_trips is not None
                    else "."
                )
            )
        text += _settle_bound(mine)
        lines.append(text)
    setups = _scale_setups(ours)
    scale = [(p, ours[f"scale_{p}p-c{c}"]["median"]) for p, c in setups]
    if scale:
        locks = ours.get("locks_during_scale", {})
        worst_key, worst = max(
            ((k, v.get("mean_waiting_on_lock", 0)) for k, v in locks.items()),
            key=lambda kv: kv[1],
            default=("", 0),
        )
        text = (
            "- **Scale-out**: "
            + ", ".join(f"{p} process{'es' if p > 1 else ''} {r:,.0f}" for p, r in scale)
            + " jobs/s."
        )
        busy = [
            costs[f"{p}p-c{c}"] for p, c in setups if "cpus_busy" in costs.get(f"{p}p-c{c}", {})
        ]
        if busy:
            text += (
                " The machine's CPUs busy meanwhile (server and workers together): "
                + ", ".join(f"{cost['cpus_busy']:.2f}" for cost in busy)
                + f" of {busy[0]['cpus']:.0f}. Once they are all busy, one process more"
                " brings its own Python and connections to the same CPUs, not capacity:"
                " the curve can rise only while CPUs are idle."
            )
        if worst > 0.1:
            events = ", ".join(list(locks[worst_key].get("wait_events", {}))[:3])
            text += (
                f" Lock waits do appear as processes are added: {worst:.2f} backends"
                f" waited on a lock on average at {worst_key} ({events})."
            )
            waits = locks[worst_key].get("waits_for", {})
            if waits:
                pair, samples = next(iter(waits.items()))
                waiter, _, blocker = pair.partition(" ← ")
                text += (
                    f" The commonest: a worker's {waiter} statement waiting for another's"
                    f" {blocker} ({samples} samples). The claim's candidate scan skips"
                    " locked jobs (`SKIP LOCKED`) and never waits; what waits is the"
                    " finish of a job that another worker's claim met: a claim whose"
                    " snapshot still shows the job Queued locks the job's newest version"
                    " (Running) before it rechecks it and passes over it, and holds that"
                    " lock to its commit (`FOR UPDATE` in READ COMMITTED). The statement"
                    " claims before it finishes, which keeps that window short."
                )
        else:
            text += " No backend waited on a lock for long: claims skip locked rows."
        lines.append(text)
    bulk, peer = _median(ours, "enqueue_bulk"), _median(pgq, "enqueue_bulk")
    if bulk and peer:
        lines.append(
            f"- **Bulk submit**: {bulk:,.0f} against pgqueuer's {peer:,.0f} jobs/s"
            f" ({bulk / peer:.2f}×), each item still idempotent per identity with its own"
            " outcome and snapshot (J2/J3). The server's share is smaller than"
            " pgqueuer's (one row and four index entries a job — primary key, identity,"
            " due, scope — where pgqueuer writes a queue row and a log row); what is"
            " left is ours on the client per item: validating and serialising each"
            " submission and building its snapshot and result."
        )
    sleep = sleep_line(document)
    if sleep:
        rate, ideal, concurrency = sleep
        text = (
            f"- **A 5 ms handler at concurrency {concurrency}**: {rate:,.0f} jobs/s,"
            f" {rate / ideal:.0%} of the ideal {ideal:,.0f}. Between a handler's end and"
            " the next job on its thread there is a settle — one durable commit — since a"
            " worker claims only for free capacity (J14); a slot turns over at most every"
            " 5 ms plus a settle"
        )
        if floor:
            text += (
                f" ({1000 / floor:.2f} ms a statement at the floor in this run: at most"
                f" {5 / (5 + 1000 / floor):.0%} of the ideal even if every settle ran at once)"
            )
        text += "."
        slot = document.get("slot_profile")
        if slot:
            text += (
                f" Profiled, a slot's turn was {slot['handler_ms']:.2f} ms of handler,"
                f" {slot['wait_for_settle_ms']:.2f} ms waiting for the settle under way,"
                f" {slot['settle_ms']:.2f} ms for its own settle (one WAL sync"
                f" {slot['wal_sync_ms']:.2f} ms) and {slot['handoff_ms']:.2f} ms of"
                " hand-off to a thread: the commit between two jobs on a slot, not the"
                " worker's Python, is what keeps it from the ideal."
            )
        text += _settle_bound(costs.get(f"1p-c{concurrency}/sleep5", {}))
        durable = _median(ours, f"syncmode_sleep5_c{concurrency}_durable")
        fast = _median(ours, f"syncmode_sleep5_c{concurrency}_async")
        if durable and fast:
            text += (
                f" With `ASYNCHRONOUS_COMMIT` (no WAL flush waited for): {fast:,.0f}"
                f" against {durable:,.0f} jobs/s measured beside it, {fast / ideal:.0%}"
                " of the ideal."
            )
        lines.append(text)
    queued = document.get("queued_claim_cost")
    if queued:
        lines.append(_deep_queue_text(queued))
    return "\n".join(lines)


def _settle_bound(cost: dict[str, Any]) -> str:
    """What the CPUs busy during a one-process burn-down say (empty if not measured)."""
    if "cpus_busy" not in cost:
        return ""
    text = f" The machine's CPUs were {cost['cpus_busy']:.2f} of {cost['cpus']:.0f} busy meanwhile"
    if cost["cpus_busy"] < 0.75 * cost["cpus"]:
        return text + (
            ": not the CPUs but the settles' latency bounds this rate. One process runs"
            " one settle at a time (two side by side were measured slower: smaller"
            " batches, each its own statement and commit), and a settle is a round trip,"
            " the statement's execution on one server backend and one WAL flush."
        )
    return text + "."


def _sleep_text(document: dict[str, Any]) -> str:
    sleep = sleep_line(document)
    if sleep is None:
        return "_Not measured in this run._"
    rate, ideal, concurrency = sleep
    text = (
        f"A handler that sleeps 5 ms, one worker process at concurrency {concurrency}:"
        f" **{rate:,.0f} jobs/s** against the ideal {ideal:,.0f} ({concurrency} handlers"
        f" each finishing 200 jobs a second) — {rate / ideal:.0%} of it."
    )
    slot = document.get("slot_profile")
    if not slot:
        return text
    cycle = sum(slot[k] for k in ("handler_ms", "wait_for_settle_ms", "settle_ms", "handoff_ms"))
    rows = [
        ("The handler (`run_attempt`: the 5 ms sleep and its call)", slot["handler_ms"]),
        ("Waiting for the settle under way (one runs at a time)", slot["wait_for_settle_ms"]),
        ("Its own settle: finish and claim, one statement and its commit", slot["settle_ms"]),
        ("Hand-off of the new claim to a handler thread", slot["handoff_ms"]),
    ]
    lines = [
        text,
        "",
        f"Where a handler thread's time goes (`benchmarks/profiling.py`, a worker in the"
        f" harness's process at concurrency {slot['concurrency']} over {slot['jobs']:,}"
        f" such jobs, {slot['jobs_per_s']:,.0f} jobs/s there; mean ms per attempt, from"
        " its handler's start to the start of the next attempt on that slot):",
        "",
        "| Part of a slot's turn | ms |",
        "|---|---|",
        *(f"| {label} | {value:.2f} |" for label, value in rows),
        f"| **One turn** | **{cycle:.2f}** |",
        "",
        f"{slot['jobs_per_settle']:.1f} jobs per settle; one WAL sync took"
        f" {slot['wal_sync_ms']:.2f} ms. The handler is"
        f" {slot['handler_ms'] / cycle:.0%} of a turn: the rest is the settle a slot waits"
        " for before its next job, which J14 (claims only for free capacity) and J8 (the"
        " finish in a committed transaction) put between two jobs on one slot.",
    ]
    return "\n".join(lines)


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
- **Bulk submit**: `submit_jobs` on PostgreSQL is one prepared statement in
  autocommit whatever the batch size: the batch travels as one JSON parameter (an
  array of rows, written by the C JSON encoder, read once by the server; the scope
  hashes once each), a plain insert guarded by `NOT EXISTS` on the identity — no
  speculative insertion, so one WAL record per job fewer than `ON CONFLICT` — with
  the queues' wake-ups in the same statement, and one row back. A race lost to a
  concurrent insert of the same identity (a unique violation) rolls that statement
  back and redoes the batch with `ON CONFLICT DO NOTHING`; either way each item keeps
  its own outcome (J2/J3). `python -m benchmarks --only bulk` measures this alone
  against pgqueuer, with the server's time, WAL and statements per job.

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


def _deep_queue_text(queued: dict[str, Any]) -> str:
    deep, shallow = queued["deep"], queued["shallow"]
    text = (
        f"- **Deep queue**: right after a checkpoint a claim of 1 costs"
        f" {queued['ratio_claim_1']:.2f}× and a claim of 16 {queued['ratio_claim_16']:.2f}×"
        f" with {queued['deep_rows']:,} queued jobs as with {queued['shallow_rows']:,}."
    )
    if "steady" not in deep:
        return text
    text += (
        f" After {queued['warm_claims']:,} more claims since that checkpoint, as on a"
        f" server that has been claiming for a while: {queued['steady_ratio_claim_1']:.2f}×"
        f" and {queued['steady_ratio_claim_16']:.2f}×. The candidate scan reads the due"
        " index in claim order at either depth. The difference is the claim's update:"
        " it is not HOT (status and token are indexed), so it adds an entry to every"
        " index, and in a deep queue the identity and scope indexes are thousands of"
        " pages; the first change of each page after a checkpoint writes the whole page"
        " to the WAL"
    )
    if "wal_bytes_per_job" in deep:
        text += (
            f" ({_num(deep['wal_bytes_per_job'], 0)} WAL bytes per claimed job right"
            f" after the checkpoint against {_num(shallow['wal_bytes_per_job'], 0)} in"
            f" the shallow queue; {_num(deep['steady']['wal_bytes_per_job'], 0)} against"
            f" {_num(shallow['steady']['wal_bytes_per_job'], 0)} later)"
        )
    return text + ", once per page in each checkpoint cycle."
