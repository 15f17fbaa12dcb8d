"""``python -m benchmarks``: measure django-ledon and its peers; see README.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .server import DATABASE_URL_HELP
from .systems import ADAPTERS
from .systems.base import ROOT


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="a small smoke run (one run, tiny counts)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument(
        "--systems",
        default=",".join(ADAPTERS),
        help=f"comma-separated subset of: {', '.join(ADAPTERS)} (default: all installed)",
    )
    parser.add_argument("--database-url", help=DATABASE_URL_HELP)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results", help="raw JSON directory"
    )
    parser.add_argument(
        "--docs",
        type=Path,
        help="write the tables here (default: docs/benchmark-results.md for a full run)",
    )
    parser.add_argument(
        "--only",
        choices=[
            "flow-control",
            "fair-share",
            "ordering",
            "burn-down",
            "bulk",
            "cpu",
            "profile",
            "outbox",
            "start-up",
            "targets",
        ],
        help="measure only this part and print its figures (flow-control: django-ledon "
        "alone; fair-share: fair share on and off, the noisy neighbour and the submit "
        "costs of unique and debounced jobs, django-ledon alone; burn-down: the no-op "
        "handler at 1x4, 1x16 and 2x16, the 5 ms handler "
        "at 16 (with and without look-ahead) and 64, some with settings of ours changed; "
        "bulk: the bulk enqueue of --systems; cpu: the CPU-bound handler, one process "
        "against run_jobs --processes; profile: where one job's time goes, in a worker "
        "in this process, and its CPU per job by part; outbox: ordered delivery, what keys "
        "cost a dispatcher and the order of 100 keys through 4 dispatchers with a failing "
        "broker; start-up: run_jobs --burst on an empty queue, 15 times; targets: all the "
        "worker's targets in one run, with their verdicts)",
    )
    parser.add_argument(
        "--compare",
        metavar="REV",
        help="measure only the burn-downs of this tree against the commit REV (a git "
        "worktree of it), interleaved: jobs/s, workers' CPU and statements per job; with "
        "--only burn-down, the no-op burn-down at concurrency 4 and 16 alone",
    )
    parser.add_argument(
        "--jobs-factor",
        type=float,
        default=1.0,
        help="scale the jobs of every measurement (a loaded machine: 0.5); rates stay "
        "comparable, the claim costs' table sizes stay",
    )
    parser.add_argument(
        "--setups",
        metavar="KIND-cN,...",
        help="with --only burn-down or --compare: only the burn-downs of one process, "
        "at default settings, of these handler kinds at these concurrencies "
        "(noop-c16,sleep5-c16; kinds: noop, sleep5, sleep5async)",
    )
    parser.add_argument(
        "--cpu-burner",
        action="store_true",
        help="run a process that keeps one CPU busy beside the whole run (as on a machine "
        "that does other work), and say so in the results",
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="measure nothing: write the report of an earlier run's raw results",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.systems.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ADAPTERS))
    if unknown:
        parser.error(f"unknown system(s): {', '.join(unknown)}")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not 0 < args.jobs_factor <= 10:
        parser.error("--jobs-factor must be above 0 and at most 10")
    args.system_names = names
    args.setups = _setups(parser, args.setups)
    if args.docs is None and not args.quick:
        args.docs = ROOT / "docs" / "benchmark-results.md"
    return args


def _setups(
    parser: argparse.ArgumentParser, value: str | None
) -> frozenset[tuple[str, int]] | None:
    """``--setups``: (handler kind, concurrency) pairs; None: every set-up."""
    if value is None:
        return None
    chosen: set[tuple[str, int]] = set()
    for item in (part.strip() for part in value.split(",") if part.strip()):
        kind, _, concurrency = item.rpartition("-c")
        if kind not in ("noop", "sleep5", "sleep5async") or not concurrency.isdigit():
            parser.error(f"--setups: {item!r} is not KIND-cN (noop-c16, sleep5-c16, ...)")
        chosen.add((kind, int(concurrency)))
    if not chosen:
        parser.error("--setups: no set-up given")
    return frozenset(chosen)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import json
    from contextlib import ExitStack
    from dataclasses import replace

    from . import harness, physical, report, server

    if args.render is not None:
        document = json.loads(args.render.read_text())
        (args.docs or args.out / "latest.md").write_text(report.render(document))
        print(report.summary_table(document))
        return 0

    log = physical.log
    with ExitStack() as stack:
        if args.cpu_burner:
            stack.enter_context(physical.cpu_burner())
            log("a CPU burner runs beside the run (one core)")
        name = "ledon_bench"
        server_url, url = stack.enter_context(server.database(args.database_url, name))
        admin = server.django_on(url, stack)
        plan = harness.Plan.quick() if args.quick else harness.Plan(runs=args.runs)
        plan = replace(plan.scaled(args.jobs_factor), setups=args.setups)
        session: dict[str, Any] = {
            "plan": plan,
            "database_url": url,
            "out_dir": args.out,
            "log": log,
            "admin": admin,
            "cpu_burner": args.cpu_burner,
        }
        if args.compare:
            from . import compare

            result = compare.compare(
                args.compare,
                server_url=server_url,
                quick_setups=args.only == "burn-down",
                **session,
            )
            harness.write_part(args.out, "compare", result)
            print(report.compare_table({"compare": result}))
            return 0
        if args.only:
            print(report.ONLY[args.only](harness.alone(args.only, args.system_names, **session)))
            return 0
        document = harness.run_all(
            systems=args.system_names,
            server=server.server_settings(url),
            **session,
        )
    markdown = report.render(document)
    (args.out / "latest.md").write_text(markdown)
    if args.docs is not None:
        args.docs.write_text(markdown)
        log(f"report: {args.docs}")
    print(report.summary_table(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
