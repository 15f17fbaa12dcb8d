"""Soak: a fixed arrival rate, below capacity, for a long time — with a transaction
held open for a third of it — on PostgreSQL with durable commits; django-ledon,
pgqueuer and Procrastinate one after the other on the same server.

Each system gets one worker process (``--concurrency`` handlers) and an arrival loop
that enqueues one no-op job every ``1/--rate`` seconds (open loop: a slow enqueue
does not slow the arrivals down). Every handler reports its start over UDP on the
loopback interface (:mod:`benchmarks.probe`), so that the pickup time — from the
enqueue's commit to the handler's start — is measured the same way for every system.
From the first third of the run to the second, another connection holds a
``REPEATABLE READ`` transaction open (with a transaction id): no row version that
dies meanwhile can be vacuumed, as behind a long report or a forgotten ``BEGIN``.

Per minute: arrivals, jobs started per second, pickup p50/p99, and the system's
tables — total size, index size, live and dead tuples — measured before the run,
every minute during it and after it drained. ``python -m benchmarks.soak --minutes
3`` is a short run; ``make soak`` the full 30 minutes per system (not in CI).

``--workflows RATE`` adds workflow runs to django-ledon's soak, beside its jobs: RATE
runs per second, each with a timer and a signal; per minute, the advances' latency
p50/p99, and the verdicts — p99 while the horizon is pinned within 3x of before,
and back within a minute (:mod:`benchmarks.soak_workflows`).
Results: ``benchmarks/results/soak-latest.json``, ``soak-latest.md`` and a plot,
``soak-latest.svg`` (``python -m benchmarks.soak --render`` redraws both from the JSON).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import soak_workflows
from .harness import Starts, percentile, wait_for, workers
from .physical import log
from .report import columns, table
from .server import database, django_on, server_settings
from .soak_workflows import WorkflowArrivals
from .systems import OURS, System, WorkerConfig, adapter

RESULTS = Path(__file__).resolve().parent / "results"
#: The settings of a soak with workflows: the benchmarks' plus the workflows app.
WORKFLOW_SETTINGS = "benchmarks.wf_settings"
SYSTEMS = [OURS, "pgqueuer", "procrastinate"]
SERVER_KEYS = ("server_version", "fsync", "synchronous_commit")

#: Each system's tables, as ``LIKE`` patterns over ``pg_stat_user_tables.relname``.
TABLES = {
    OURS: ["jobs\\_%", "workflows\\_%"],
    "pgqueuer": ["pgqueuer%"],
    "procrastinate": ["procrastinate\\_%"],
}


def table_stats(admin_url: str, patterns: list[str]) -> dict[str, Any]:
    """Size, index size, live and dead tuples of the tables ``patterns`` match, and
    their sums."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, pg_total_relation_size(relid), pg_indexes_size(relid),"
            " n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relname LIKE ANY(%s)"
            " ORDER BY relname",
            [patterns],
        ).fetchall()
    tables = {
        name: {"bytes": total, "index_bytes": index, "live": live, "dead": dead}
        for name, total, index, live, dead in rows
    }
    return {
        "tables": tables,
        "bytes": sum(t["bytes"] for t in tables.values()),
        "index_bytes": sum(t["index_bytes"] for t in tables.values()),
        "live": sum(t["live"] for t in tables.values()),
        "dead": sum(t["dead"] for t in tables.values()),
    }


def held_transaction(url: str) -> Any:
    """A ``REPEATABLE READ`` transaction with a transaction id, open until its
    connection is closed (which rolls it back)."""
    import psycopg

    conn = psycopg.connect(url)
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    conn.execute("SELECT txid_current()")
    return conn


def soak(
    system: System,
    url: str,
    *,
    minutes: float,
    rate: float,
    concurrency: int,
    log_dir: Path,
    runs: WorkflowArrivals | None = None,
) -> dict[str, Any]:
    """One system's soak (see the module docstring); ``runs``: workflow runs beside
    its jobs (django-ledon)."""
    patterns = TABLES[system.name]
    committed: dict[int, float] = {}
    samples: list[dict[str, Any]] = []
    duration = minutes * 60
    hold_from, hold_until = duration / 3, 2 * duration / 3
    config = system.worker_config(WorkerConfig(1, concurrency))
    # With runs, the worker has the workflows app and the soak's workflow too.
    env = {"DJANGO_SETTINGS_MODULE": WORKFLOW_SETTINGS} if runs is not None else {}
    with (
        Starts() as starts,
        workers(system, config, log_dir, f"soak-{system.name}", {**starts.env, **env}),
    ):
        system.enqueue_marked(-1)
        starts.wait(-1, 120)
        before = table_stats(url, patterns)
        held: Any = None
        start = time.time()
        if runs is not None:
            runs.begin(start)
        next_sample = start + 60
        marker = 0
        while True:
            now = time.time()
            elapsed = now - start
            if elapsed >= duration:
                break
            if runs is not None:
                runs.tick(now)
            if held is None and hold_from <= elapsed < hold_until:
                held = held_transaction(url)
                log(f"  {system.name}: transaction held open at {elapsed:.0f} s")
            elif held is not None and elapsed >= hold_until:
                held.close()
                held = None
                log(f"  {system.name}: held transaction closed at {elapsed:.0f} s")
            if now >= next_sample:
                samples.append({"at": round(elapsed), **table_stats(url, patterns)})
                next_sample += 60
                log(f"  {system.name}: minute {len(samples)}, {marker} enqueued")
            due = start + marker / rate
            if now < due:
                time.sleep(min(due - now, 0.05))
                continue
            system.enqueue_marked(marker)
            committed[marker] = time.time()
            marker += 1
        if held is not None:
            held.close()
        while runs is not None and not runs.all_signalled():
            runs.tick(time.time(), arriving=False)
            time.sleep(0.05)
        markers = list(committed) + (runs.markers() if runs is not None else [])
        wait_for(lambda: all(m in starts.seen for m in markers), 300, "the backlog", poll=0.1)
        drained = time.time() - start
        after = table_stats(url, patterns)
    result = {
        "minutes": minutes,
        "rate": rate,
        "concurrency": config.concurrency,
        "enqueued": len(committed),
        "held_open_s": [round(hold_from), round(hold_until)],
        "drained_s": round(drained, 1),
        "per_minute": per_minute(committed, starts.seen, start, minutes),
        "tables_before": before,
        "tables_during": samples,
        "tables_after": after,
    }
    if runs is not None:
        advances = runs.advances(starts.seen)
        result["workflows"] = {
            "rate": runs.rate,
            "runs": len(runs.started),
            "sleep_s": runs.sleep,
            "signal_after_s": runs.signal_after,
            "per_minute": soak_workflows.per_minute(advances, start, minutes),
            "verdicts": soak_workflows.verdicts(advances, start, (hold_from, hold_until)),
        }
    return result


def per_minute(
    committed: dict[int, float], started: dict[int, float], start: float, minutes: float
) -> list[dict[str, Any]]:
    """Arrivals, starts per second and pickup p50/p99 (ms) of each minute of the run,
    the pickup counted in the minute of the job's arrival."""
    rows = []
    for minute in range(int(-(-minutes // 1))):
        low, high = start + 60 * minute, start + 60 * (minute + 1)
        arrived = [m for m, t in committed.items() if low <= t < high]
        pickups = [(started[m] - committed[m]) * 1000 for m in arrived if m in started]
        begun = sum(1 for m, t in started.items() if m >= 0 and low <= t < high)
        seconds = min(60.0, minutes * 60 - 60 * minute)  # the last minute may be short
        rows.append(
            {
                "minute": minute + 1,
                "arrived": len(arrived),
                "started_per_s": round(begun / seconds, 2),
                "pickup_p50_ms": round(percentile(pickups, 0.5), 2) if pickups else None,
                "pickup_p99_ms": round(percentile(pickups, 0.99), 2) if pickups else None,
            }
        )
    return rows


def render(document: dict[str, Any]) -> str:
    """The results as Markdown: the run, then per system a table of its minutes and
    one of its tables' sizes before and after."""
    server, minutes = document["server"], document["minutes"]
    lines = [
        "# Soak",
        "",
        table(
            ["Run", ""],
            [
                ["Started", document["started"]],
                ["PostgreSQL", ", ".join(f"{k} {server.get(k, '?')}" for k in SERVER_KEYS)],
                ["Arrivals", f"{document['rate']} jobs/s for {minutes} min"],
                ["Worker", f"one process at concurrency {document['concurrency']}"],
                ["Transaction held open", f"minute {minutes / 3:g} to {2 * minutes / 3:g}"],
            ],
        ),
    ]
    for name, result in document["systems"].items():
        lines += ["", f"## {name}", ""]
        if "skipped" in result:
            lines.append(f"Skipped: {result['skipped']}")
            continue
        during = {round(s["at"] / 60): s for s in result["tables_during"]}
        flows = result.get("workflows", {}).get("per_minute", [])
        rows = [
            {
                **{k.replace("_", " "): v for k, v in row.items()},
                **{k.replace("_", " "): v for k, v in (flows[i] if i < len(flows) else {}).items()},
                "table MB": _mb(during.get(row["minute"], {}).get("bytes")),
                "index MB": _mb(during.get(row["minute"], {}).get("index_bytes")),
                "dead tuples": during.get(row["minute"], {}).get("dead", ""),
            }
            for i, row in enumerate(result["per_minute"])
        ]
        ends = [
            ("before", result["tables_before"]),
            (f"after draining ({result['drained_s']} s)", result["tables_after"]),
        ]
        sizes = [
            [when, _mb(t["bytes"]), _mb(t["index_bytes"]), t["live"], t["dead"]] for when, t in ends
        ]
        lines += [columns(rows), "", table(["Tables", "MB", "index MB", "live", "dead"], sizes)]
        if "workflows" in result:
            lines += ["", *workflow_verdicts(result["workflows"])]
    return "\n".join(lines)


def workflow_verdicts(flows: dict[str, Any]) -> list[str]:
    """The workflows' line and their two verdicts (see :mod:`benchmarks.soak_workflows`)."""
    v = flows["verdicts"]

    def said(ok: bool | None) -> str:
        return "not measured" if ok is None else ("met" if ok else "**missed**")

    return [
        f"Workflows: {flows['runs']} runs at {flows['rate']:g}/s, each a {flows['sleep_s']:g} s"
        f" timer then a signal {flows['signal_after_s']:g} s after its start.",
        "",
        table(
            ["Advance latency p99", "ms", "against before", "target"],
            [
                ["before the pin (from minute 2)", v["p99_before_ms"], "", ""],
                [
                    "while the horizon is pinned",
                    v["p99_pinned_ms"],
                    v["pinned_ratio"],
                    f"<= {soak_workflows.PINNED_FACTOR:g}x: {said(v['pinned_ok'])}",
                ],
                [
                    "the minute after",
                    v["p99_minute_after_ms"],
                    v["after_ratio"],
                    f"<= {soak_workflows.BACK_FACTOR:g}x: {said(v['back_within_a_minute'])}",
                ],
            ],
        ),
    ]


#: Line colours of the plot, one per system in the order they ran.
COLOURS = ["#1f6feb", "#d97706", "#7c3aed", "#059669"]


def _tag(name: str, text: str = "", **attrs: Any) -> str:
    """One SVG element (``stroke_width`` is written ``stroke-width``)."""
    written = " ".join(
        f'{k.replace("_", "-")}="{v:.1f}"'
        if isinstance(v, float)
        else f'{k.replace("_", "-")}="{v}"'
        for k, v in attrs.items()
    )
    return f"<{name} {written}>{text}</{name}>" if text else f"<{name} {written}/>"


def plot(document: dict[str, Any]) -> str:
    """The results as an SVG picture: per minute, each system's pickup p99 and its
    tables' dead tuples, the minutes with the transaction held open shaded."""
    runs = {n: r for n, r in document["systems"].items() if "per_minute" in r}
    minutes = max(1, math.ceil(float(document["minutes"])))
    panels = [
        (
            "pickup p99 (ms)",
            {n: [m["pickup_p99_ms"] for m in r["per_minute"]] for n, r in runs.items()},
        ),
        (
            "dead tuples (thousands)",
            {n: [t["dead"] / 1000 for t in r["tables_during"]][:minutes] for n, r in runs.items()},
        ),
    ]
    width, height, left, top, gap = 720, 220, 60, 30, 60
    total = top + len(panels) * (height + gap) + 20
    legend = left + width + 20
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{legend + 160}" height="{total}"'
        ' font-family="sans-serif" font-size="12">',
        _tag("rect", width="100%", height="100%", fill="white"),
    ]

    def x(minute: float) -> float:
        return left + (minute - 0.5) / minutes * width

    held = (x(minutes / 3 + 0.5), x(2 * minutes / 3 + 0.5))
    for index, (title, series) in enumerate(panels):
        y0 = top + index * (height + gap)
        bottom = y0 + height
        values = [v for line in series.values() for v in line if v is not None]
        high = max(values, default=0) * 1.1 or 1.0
        out += [
            _tag("rect", x=held[0], y=y0, width=held[1] - held[0], height=height, fill="#f3f4f6"),
            _tag("text", title, x=left, y=y0 - 8, font_weight="bold"),
            _tag("line", x1=left, y1=bottom, x2=left + width, y2=bottom, stroke="#555"),
            _tag("line", x1=left, y1=y0, x2=left, y2=bottom, stroke="#555"),
        ]
        for tick in range(1, 5):
            y = bottom - height * tick / 4
            out += [
                _tag("text", f"{high * tick / 4:.0f}", x=left - 6, y=y + 4, text_anchor="end"),
                _tag("line", x1=left, y1=y, x2=left + width, y2=y, stroke="#e5e7eb"),
            ]
        for minute in range(5, minutes + 1, 5):
            out.append(_tag("text", str(minute), x=x(minute), y=bottom + 16, text_anchor="middle"))
        for colour, line in zip(COLOURS, series.values(), strict=False):
            points = " ".join(
                f"{x(minute):.1f},{bottom - height * v / high:.1f}"
                for minute, v in enumerate(line, 1)
                if v is not None
            )
            out.append(_tag("polyline", points=points, fill="none", stroke=colour, stroke_width=2))
    for row, (colour, name) in enumerate([*zip(COLOURS, runs, strict=False), ("#f3f4f6", "")]):
        y = top + 10 + row * 18
        out += [
            _tag("rect", x=legend, y=y - 9, width=12, height=12, fill=colour, stroke="#999"),
            _tag("text", name or "transaction held", x=legend + 18, y=y + 1),
        ]
    out += [
        _tag("text", "minute of the run", x=left + width / 2, y=total - 8, text_anchor="middle"),
        "</svg>",
    ]
    return "\n".join(out) + "\n"


def _mb(value: Any) -> str:
    return "" if value is None else f"{value / 1e6:.2f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30, help="per system (default 30)")
    parser.add_argument("--rate", type=float, default=20, help="arrivals per second")
    parser.add_argument("--concurrency", type=int, default=4, help="handlers per worker")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument(
        "--workflows",
        type=float,
        default=0,
        metavar="RATE",
        help="also RATE workflow runs per second (a timer and a signal each) beside"
        " django-ledon's jobs (default: none)",
    )
    parser.add_argument(
        "--render",
        action="store_true",
        help="only redraw soak-latest.md and soak-latest.svg from soak-latest.json",
    )
    args = parser.parse_args(argv)
    if args.render:
        write_reports(json.loads((RESULTS / "soak-latest.json").read_text()))
        return
    log_dir = RESULTS / "soak-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "minutes": args.minutes,
        "rate": args.rate,
        "concurrency": args.concurrency,
        "workflows": args.workflows,
        "systems": {},
    }
    with ExitStack() as stack:
        _, url = stack.enter_context(database(None, "ledon_soak"))
        django_on(url, stack, WORKFLOW_SETTINGS if args.workflows else "benchmarks.settings")
        document["server"] = server_settings(url)
        for name in args.systems.split(","):
            cls = adapter(name)
            if not cls.available():
                document["systems"][name] = {"skipped": "not installed (the bench extra)"}
                continue
            system = cls(url)
            try:
                system.install()
                system.reset()
                log(f"soak {name}: {args.minutes:g} min at {args.rate:g} jobs/s")
                document["systems"][name] = soak(
                    system,
                    url,
                    minutes=args.minutes,
                    rate=args.rate,
                    concurrency=args.concurrency,
                    log_dir=log_dir,
                    runs=WorkflowArrivals(args.workflows)
                    if args.workflows and name == OURS
                    else None,
                )
            finally:
                system.close()
            (RESULTS / "soak-latest.json").write_text(json.dumps(document, indent=2))
    write_reports(document)


def write_reports(document: dict[str, Any]) -> None:
    report = render(document)
    (RESULTS / "soak-latest.md").write_text(report + "\n")
    (RESULTS / "soak-latest.svg").write_text(plot(document))
    print(report)


if __name__ == "__main__":
    main()
