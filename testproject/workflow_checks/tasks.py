"""Workflows and activities for the workflow engine's tests (names ``checks.*``)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from workflows import WorkflowContext, activity, current_activity, workflow
from workflows.exceptions import SignalTimeout, StepFailed

from .models import Effect

#: Tries of ``flaky`` per (run id, key) in this process (its failed tries roll back
#: whatever they wrote, so the count lives here).
TRIES: dict[tuple[str, str], int] = {}


def _effect(run_id: str, key: str, kind: str = "step") -> None:
    Effect.objects.create(run_id=run_id, key=key, kind=kind, pid=os.getpid())


def write_effect(run_id: str, key: str, value: Any) -> Any:
    """An inline step that writes a row: committed with its checkpoint or not at all."""
    _effect(run_id, key)
    return value


def flaky(run_id: str, key: str, fail_times: int) -> str:
    """Writes a row, then fails its first ``fail_times`` tries (the row rolls back)."""
    _effect(run_id, key)
    TRIES[(run_id, key)] = tries = TRIES.get((run_id, key), 0) + 1
    if tries <= fail_times:
        raise ConnectionError(f"try {tries} failed")
    return f"ok after {tries}"


@activity("checks.double", retries=2)
def double(item: dict[str, Any]) -> int:
    _effect(item["run"], str(item["value"]), "activity")
    return int(item["value"]) * 2


@activity("checks.boom", retries=1)
def boom(value: int) -> int:
    raise ValueError(f"cannot take {value}")


@workflow("checks.linear", version=1)
def linear(wf: WorkflowContext) -> dict[str, Any]:
    a = wf.step("a", write_effect, wf.run_id, "a", (wf.input or {}).get("start", 1))
    b = wf.step("b", write_effect, wf.run_id, "b", a + 1)
    return {"a": a, "b": b}


@workflow("checks.fanout", version=1)
def fanout(wf: WorkflowContext) -> dict[str, Any]:
    doubled = wf.map("double", double, [{"run": wf.run_id, "value": n} for n in wf.input["items"]])
    total = wf.step("total", write_effect, wf.run_id, "total", sum(doubled))
    return {"doubled": doubled, "total": total}


@workflow("checks.sleeper", version=1)
def sleeper(wf: WorkflowContext) -> str:
    wf.step("before", write_effect, wf.run_id, "before", 1)
    wf.sleep("nap", wf.input["seconds"])
    wf.step("after", write_effect, wf.run_id, "after", 2)
    return "woke"


@workflow("checks.signals", version=1)
def signals(wf: WorkflowContext) -> Any:
    try:
        payload = wf.wait_for_signal("approved", timeout=wf.input.get("timeout"))
    except SignalTimeout:
        return "timed out"
    wf.step("after", write_effect, wf.run_id, "after", 1)
    return payload


@workflow("checks.parent", version=1)
def parent(wf: WorkflowContext) -> Any:
    out = wf.child("kid", wf.input.get("child", "checks.linear"), {"start": 10})
    return {"child": out}


@workflow("checks.flaky", version=1)
def flaky_flow(wf: WorkflowContext) -> Any:
    try:
        return wf.step(
            "flaky",
            flaky,
            wf.run_id,
            "flaky",
            wf.input["fail_times"],
            retries=wf.input["retries"],
        )
    except StepFailed as exc:
        if not wf.input.get("catch"):
            raise
        return {"caught": exc.key, "type": exc.cause_type, "message": exc.cause_message}


@workflow("checks.failing_map", version=1)
def failing_map(wf: WorkflowContext) -> Any:
    return wf.map("boom", boom, [1, 2, 3])


@workflow("checks.activity", version=1)
def one_activity(wf: WorkflowContext) -> Any:
    return wf.step("double", double, {"run": wf.run_id, "value": wf.input["value"]})


@workflow("checks.twice", version=1)
def twice(wf: WorkflowContext) -> Any:
    wf.step("same", write_effect, wf.run_id, "same", 1)
    wf.step("same", write_effect, wf.run_id, "same", 2)
    return "unreachable"


@workflow("checks.clock", version=1)
def clock(wf: WorkflowContext) -> Any:
    first = wf.now("t")
    wf.sleep("nap", 60)
    return {"t": first.isoformat(), "again": wf.now("t2") >= first}


@activity("checks.until_cancelled")
def until_cancelled(run_id: str) -> str:
    """Runs until its job's cancellation is requested (the run was cancelled)."""
    _effect(run_id, "started", "activity")
    job = current_activity()
    if job.wait_for_cancel(120):
        _effect(run_id, "saw-cancel", "activity")
    return "stopped"


@activity("checks.kills_its_worker")
def kills_its_worker(run_id: str) -> str:
    """Kills the worker running it (SIGKILL), every try: an item whose job keeps
    dying."""
    _effect(run_id, "dying", "activity")
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@workflow("checks.dies", version=1)
def dies(wf: WorkflowContext) -> Any:
    return wf.step("die", kills_its_worker, wf.run_id)


def kill_this_worker() -> str:
    """An inline step that kills the worker running it (SIGKILL), every try: a run
    whose advance keeps killing its worker."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@workflow("checks.dies_inline", version=1)
def dies_inline(wf: WorkflowContext) -> Any:
    wf.step("before", write_effect, wf.run_id, "before", 1)
    return wf.step("die", kill_this_worker)


@activity("checks.hangs", timeout=0.5, queue="checks-hang")
def hangs(marker: str) -> str:
    """Says it started (``marker``), then ignores its timeout's cancellation: its
    worker fails its job (``JobTimedOut``) without the activity's code recording
    the item."""
    Path(marker).touch()
    threading.Event().wait(300)
    return "too late"


@workflow("checks.hang", version=1)
def hang(wf: WorkflowContext) -> Any:
    try:
        return wf.step("hang", hangs, wf.input["marker"])
    except StepFailed as failure:
        return wf.step("after", write_effect, wf.run_id, "after", failure.cause_type)


@workflow("checks.cancellable", version=1)
def cancellable(wf: WorkflowContext) -> Any:
    return wf.step("wait", until_cancelled, wf.run_id)


@workflow("checks.until", version=1)
def until(wf: WorkflowContext) -> Any:
    from datetime import datetime

    wf.sleep_until("alarm", datetime.fromisoformat(wf.input["when"]))
    return wf.now("woke").isoformat()


@workflow("checks.bad_args", version=1)
def bad_args(wf: WorkflowContext) -> Any:
    return wf.step("double", double, {"run": wf.run_id, "value": {1, 2}})


#: Items of "checks.resumable" that fail, by value (tests change it).
FAILING: set[int] = set()


@activity("checks.picky")
def picky(value: int) -> int:
    if value in FAILING:
        raise LookupError(f"no {value}")
    return value


@workflow("checks.resumable", version=1)
def resumable(wf: WorkflowContext) -> Any:
    first = wf.step("first", write_effect, wf.run_id, "first", 1)
    values = wf.map("pick", picky, [1, 2, 3])
    return {"first": first, "values": values}


from . import branches  # noqa: E402, F401  (its workflows register with these)
