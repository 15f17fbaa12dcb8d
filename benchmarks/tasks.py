"""The handlers the benchmarks run (found by the worker's autodiscovery): a no-op, one
that sleeps 5 ms — a handler that waits on something, as real ones do — in both
forms, a plain function and an ``async def``, and one that
computes in pure Python for about 20 ms."""

from __future__ import annotations

import asyncio
import time

from jobs import JobContext, job_handler

from . import probe, work


@job_handler("bench.noop", version=1)
def noop(ctx: JobContext) -> None:
    probe.started(ctx.payload["n"])


@job_handler("bench.sleep5", version=1)
def sleep_5ms(ctx: JobContext) -> None:
    time.sleep(work.SLEEP_SECONDS)


@job_handler("bench.sleep5async", version=1)
async def sleep_5ms_async(ctx: JobContext) -> None:
    await asyncio.sleep(work.SLEEP_SECONDS)


@job_handler("bench.cpu20", version=1)
def cpu_20ms(ctx: JobContext) -> None:
    work.compute()
