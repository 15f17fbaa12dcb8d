"""Workflows of the engine's tests that run branches side by side (``wf.start``,
``wf.start_child``, ``wf.gather``) and runs with a deadline (names ``checks.*``).
Imported by the app's ``tasks`` module, so workers register them."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from workflows import StepHandle, WorkflowContext, activity, current_activity, workflow

from .models import Effect

#: How long a ``meet`` branch looks for the others before it gives up (seconds): a
#: bound, not an ordering; the test asserts how many it met.
MEET_PATIENCE = 60


def _effect(run_id: str, key: str, kind: str) -> None:
    Effect.objects.create(run_id=run_id, key=key, kind=kind, pid=os.getpid())


@activity("checks.price")
def price(run_id: str, value: int) -> int:
    _effect(run_id, f"price-{value}", "activity")
    return value * 10


@activity("checks.refuse")
def refuse(run_id: str, what: str) -> int:
    _effect(run_id, what, "activity")
    raise LookupError(f"no {what}")


@workflow("checks.ship", version=1)
def ship(wf: WorkflowContext) -> Any:
    """A child that waits for its signal "go" (or fails if ``fail`` is in its input)."""
    payload = wf.wait_for_signal("go")
    if wf.input.get("fail"):
        raise RuntimeError("the courier said no")
    return {"shipped": payload}


@workflow("checks.both", version=1)
def both(wf: WorkflowContext) -> Any:
    """An activity and a child started side by side, then gathered (or each awaited
    with ``result()``, in the order given by ``await``)."""
    priced = wf.start("price", price, wf.run_id, wf.input.get("value", 4))
    shipped = wf.start_child("ship", "checks.ship", {"fail": wf.input.get("child_fails", False)})
    if wf.input.get("await") == "ship-first":
        return [shipped.result(), priced.result()]
    if wf.input.get("await") == "price-first":
        return [priced.result(), shipped.result()]
    return wf.gather(priced, shipped)


@workflow("checks.gather_failures", version=1)
def gather_failures(wf: WorkflowContext) -> Any:
    """Handles started by key (``"ok"``, ``"bad-…"``, ``"child"``), gathered in the
    order of ``wf.input["order"]``."""
    handles: dict[str, StepHandle] = {}
    for key in wf.input["order"]:
        if key == "child":
            handles[key] = wf.start_child(key, "checks.ship", {})
        elif key.startswith("bad"):
            handles[key] = wf.start(key, refuse, wf.run_id, key)
        else:
            handles[key] = wf.start(key, price, wf.run_id, 1)
    return wf.gather(*(handles[key] for key in wf.input["order"]))


#: A handle kept by the run that started it, for another run to misuse.
KEPT: dict[str, StepHandle] = {}


@workflow("checks.misused_handle", version=1)
def misused_handle(wf: WorkflowContext) -> Any:
    """Misuses a handle as ``wf.input["how"]`` says: another run's, one awaited under
    another key, or one key started twice."""
    how = wf.input["how"]
    if how == "keep":
        KEPT["handle"] = wf.start("price", price, wf.run_id, 1)
        return wf.wait_for_signal("never")
    if how == "other-run":
        return wf.gather(KEPT["handle"])
    if how == "stale":
        started = KEPT.setdefault("stale", wf.start("price", price, wf.run_id, 1))
        wf.wait_for_signal("go")
        return started.result()
    first = wf.start("price", price, wf.run_id, 1)
    if how == "other-key":
        return wf.gather(dataclasses.replace(first, key="elsewhere"))
    if how == "twice":
        wf.start("price", price, wf.run_id, 2)
    if how == "not-a-handle":
        return wf.gather("price")  # type: ignore[arg-type]
    return first.result()


@activity("checks.meet")
def meet(group: str, name: str) -> int:
    """Says it is running, then looks (up to :data:`MEET_PATIENCE` seconds) for the
    other branches of ``group`` to be running too: how many were at once (its
    branches ran side by side only if every one of them saw all)."""
    _effect(group, name, "meet")
    deadline = time.monotonic() + MEET_PATIENCE
    seen = Effect.objects.filter(run_id=group, kind="meet").count()
    while seen < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
        seen = Effect.objects.filter(run_id=group, kind="meet").count()
    return seen


@workflow("checks.meet_child", version=1)
def meet_child(wf: WorkflowContext) -> Any:
    return wf.step("meet", meet, wf.input["group"], "child")


@workflow("checks.meeting", version=1)
def meeting(wf: WorkflowContext) -> Any:
    """An activity and a child whose activity must run at the same time to meet."""
    group = wf.run_id
    here = wf.start("meet", meet, group, "activity")
    there = wf.start_child("child", "checks.meet_child", {"group": group})
    return wf.gather(here, there)


@activity("checks.wait_cancel")
def wait_cancel(run_id: str, value: int = 0) -> str:
    """Runs until its job's cancellation is requested."""
    _effect(run_id, "started", "activity")
    if current_activity().wait_for_cancel(MEET_PATIENCE):
        _effect(run_id, "saw-cancel", "activity")
    return "stopped"


@workflow("checks.deadline", version=1, timeout=3600)
def deadline(wf: WorkflowContext) -> Any:
    """Within an hour (or the start's own timeout): a child and an activity started
    side by side, then a signal, then both gathered."""
    kid = wf.start_child("kid", "checks.ship", {})
    blocking = (wf.input or {}).get("blocking")
    work = wf.start("work", wait_cancel if blocking else price, wf.run_id, 3)
    wf.wait_for_signal("approved")
    return wf.gather(kid, work)


#: The key ``checks.flipping_branch`` starts its branch under (tests change it).
BRANCH_KEY = {"key": "a"}


@workflow("checks.flipping_branch", version=1)
def flipping_branch(wf: WorkflowContext) -> Any:
    started = wf.start(BRANCH_KEY["key"], price, wf.run_id, 1)
    wf.wait_for_signal("go")
    return started.result()
