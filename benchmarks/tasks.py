"""The no-op handler the benchmarks run (found by the worker's autodiscovery)."""

from __future__ import annotations

from jobs import JobContext, job_handler

from . import probe


@job_handler("bench.noop", version=1)
def noop(ctx: JobContext) -> None:
    probe.started(ctx.payload["n"])
