"""The handlers the benchmarks run (found by the worker's autodiscovery): a no-op, and
one that sleeps 5 ms — a handler that waits on something, as real ones do."""

from __future__ import annotations

import time

from jobs import JobContext, job_handler

from . import probe


@job_handler("bench.noop", version=1)
def noop(ctx: JobContext) -> None:
    probe.started(ctx.payload["n"])


#: The sleep of :func:`sleep_5ms`, in seconds.
SLEEP_SECONDS = 0.005


@job_handler("bench.sleep5", version=1)
def sleep_5ms(ctx: JobContext) -> None:
    time.sleep(SLEEP_SECONDS)
