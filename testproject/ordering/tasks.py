"""Handlers of batches and sequences, for the process tests and the benchmarks;
installed when ``ORDERING_TASKS`` is set."""

from __future__ import annotations

import json
import time
from pathlib import Path

from jobs import JobContext, job_handler
from jobs.retry import RetryPolicy

#: A failure is retried at once (the tests wait on the job, not on a back-off).
AT_ONCE = RetryPolicy(base_delay=0.0, max_delay=0.0, jitter=0.0)


def _wait_for_gate(ctx: JobContext) -> None:
    """With ``gate`` in the payload: wait until that file exists (the test opens it)."""
    gate = ctx.payload.get("gate") if isinstance(ctx.payload, dict) else None
    if gate:
        while not Path(gate).exists() and not ctx.cancel_requested:
            time.sleep(0.005)


def _note(ctx: JobContext, event: str) -> None:
    """With ``log`` in the payload: append ``event`` and the job id to that file. An
    append is one write, so the lines of every process come in the order they
    happened, with no clock to compare."""
    log = ctx.payload.get("log") if isinstance(ctx.payload, dict) else None
    if log:
        with open(log, "a", encoding="utf-8") as file:
            file.write(f"{event} {ctx.job_id}\n")


@job_handler("ordering.row", version=1, retry=AT_ONCE)
def row(ctx: JobContext) -> str:
    """A job of a batch or a sequence: waits at its ``gate`` if it has one; fails its
    first attempt when ``fail_first`` is set; notes its start and end in its ``log``."""
    _note(ctx, "start")
    try:
        _wait_for_gate(ctx)
        if ctx.payload.get("fail_first") and ctx.attempt == 1:
            raise RuntimeError("the first attempt fails")
        return str(ctx.payload.get("n"))
    finally:
        _note(ctx, "end")


@job_handler("ordering.strict", version=1, retry=AT_ONCE, sequence_halts_on_failure=True)
def strict(ctx: JobContext) -> str:
    """A job of a sequence that halts on a failure: fails its first attempt when
    ``fail_first`` is set (an operator then retries or cancels it)."""
    if ctx.payload.get("fail_first") and ctx.attempt == 1:
        raise RuntimeError("refused: the sequence halts")
    return str(ctx.payload.get("n"))


@job_handler("ordering.done", version=1)
def done(ctx: JobContext) -> str:
    """A batch's then: returns the batch's counts as it read them (``ctx.batch``)."""
    batch = ctx.batch
    assert batch is not None, "a then reads its batch"
    return json.dumps(
        {
            "total": batch.total,
            "succeeded": batch.succeeded,
            "failed": batch.failed,
            "pending": batch.pending,
            "status": batch.status,
        }
    )


@job_handler("ordering.noop", version=1)
def noop(ctx: JobContext) -> None:
    """Nothing: for the benchmarks' drains."""
