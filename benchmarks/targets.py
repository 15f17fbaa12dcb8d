"""The worker's targets from one run (``python -m benchmarks --only targets``): every
figure they are read from, measured on one throw-away server one part after the
other, and a table of the ratios with their verdicts.

The parts: the burn-downs of :func:`harness.burn_down_alone` (no-op handler at 1x4,
1x16 and 2x16; the 5 ms handler at 16 and 64; look-ahead off beside the defaults),
the flow-control burn-downs (:func:`harness.flow_control_alone`), the CPU-bound
handler with threads and with ``run_jobs --processes`` (:func:`harness.cpu_alone`),
and the idle pickup latency and one-by-one enqueue of every system.
"""

from __future__ import annotations

from typing import Any

from . import harness
from .harness import median
from .systems import OURS

PEER = "pgqueuer"


def measure(systems: list[str], **session: Any) -> dict[str, Any]:
    """Every part, then the rows (see the module docstring)."""
    plan: harness.Plan = session["plan"]
    burn = harness.burn_down_alone(systems, **session)
    flow = harness.flow_control_alone(**session)
    cpu = harness.cpu_alone(**session)
    with harness.part_alone("pickup-enqueue", systems, **session) as (runner, chosen, idle):
        for system in chosen:
            runner.log(f"{system.name}: idle pickup latency, one-by-one enqueue")
            idle.setdefault("latency", {})[system.name] = runner.latency(system)
            rates = [runner.enqueue(system) for _ in range(plan.runs)]
            idle.setdefault("enqueue_each", {})[system.name] = median(rates)
    document = {"burn": burn, "flow": flow, "cpu": cpu, "idle": idle}
    document["rows"] = rows(document)
    harness.write_part(session["out_dir"], "targets", document)
    return document


def rows(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets: what, ours, against (pgqueuer unless said), ratio, goal, holds."""
    burn = document["burn"]["median"]
    ours, peer = burn.get(OURS, {}), burn.get(PEER, {})
    found: list[dict[str, Any]] = []

    def row(
        what: str, value: float | None, against: float | None, goal: float, *, lower: bool = False
    ) -> None:
        """``value`` over ``against``, to hold at least ``goal`` (``lower``: at most)."""
        if not value or not against:
            return
        ratio = value / against
        holds = ratio <= goal if lower else ratio >= goal
        found.append(
            {
                "what": what,
                "ours": value,
                "against": against,
                "ratio": ratio,
                "goal": f"{'≤' if lower else '≥'} {goal:g}",
                "holds": holds,
            }
        )

    row(
        "5 ms handler, concurrency 16: share of the ideal 3,200/s",
        ours.get("sleep5-c16"),
        3200,
        0.85,
    )
    row("5 ms handler, concurrency 64", ours.get("sleep5-c64"), peer.get("sleep5-c64"), 1.0)
    row("No-op, 1 process, concurrency 4", ours.get("1x4"), peer.get("1x4"), 1.0)
    row("No-op, 1 process, concurrency 16", ours.get("1x16"), peer.get("1x16"), 1.5)
    row("No-op, 2 processes x 16", ours.get("2x16"), peer.get("2x16"), 1.2)
    flow = document["flow"]["median"]
    # A claim's cost is the inverse of the burn-down's rate: the seconds a job takes
    # with every limit set, over those without.
    row(
        "Claims with every limit set (none binding): ms per job against none",
        1000 / flow["all_three"],
        1000 / flow["off"],
        1.1,
        lower=True,
    )
    cpu = document["cpu"]["median"]
    processes = next((v["median"] for k, v in cpu.items() if "x-c1" in k), None)
    threads = next((v["median"] for k, v in cpu.items() if "x-c1" not in k), None)
    row(
        "CPU-bound handler, --processes 2 against one process of two threads",
        processes,
        threads,
        1.7,
    )
    latency = document["idle"]["latency"]
    best_peer = min((v["p50_ms"] for k, v in latency.items() if k != OURS), default=None)
    if OURS in latency:
        row(
            "Idle pickup p50 (ms), against the best peer's",
            latency[OURS]["p50_ms"],
            best_peer,
            1.0,
            lower=True,
        )
    enqueue = document["idle"]["enqueue_each"]
    row("Enqueue one by one", enqueue.get(OURS), enqueue.get(PEER), 1.0)
    return found


def table(document: dict[str, Any]) -> str:
    """The rows as Markdown."""
    lines = [
        "| target | django-ledon | against | ratio | goal | verdict |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in document["rows"]:
        lines.append(
            f"| {r['what']} | {r['ours']:,.2f} | {r['against']:,.2f} | {r['ratio']:.2f} |"
            f" {r['goal']} | {'holds' if r['holds'] else 'misses'} |"
        )
    extra = document["burn"]["median"].get(OURS, {})
    lines += ["", "Our set-ups beside the defaults (jobs/s, medians):", ""]
    lines += [f"- `{key}`: {value:,.0f}" for key, value in sorted(extra.items())]
    return "\n".join(lines)
