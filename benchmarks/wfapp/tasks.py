"""The workflows and the activity the workflow benchmarks run (found by the workers'
autodiscovery): a no-op inline step, a no-op activity, and bodies made of them."""

from __future__ import annotations

from typing import Any

from benchmarks import probe
from jobs import JobContext, job_handler
from workflows import WorkflowContext, activity, workflow


def nothing(n: int) -> int:
    return n


@activity("wfbench.noop")
def noop_item(n: int) -> int:
    return n


@job_handler("wfbench.noop_job", version=1)
def noop_job(ctx: JobContext) -> None:
    return None


@workflow("wfbench.linear", version=1)
def linear(wf: WorkflowContext) -> int:
    """``steps`` inline checkpoints one after the other, in one advance."""
    for index in range(wf.input["steps"]):
        wf.step(f"s{index}", nothing, index)
    return int(wf.input["steps"])


@workflow("wfbench.fan_out", version=1)
def fan_out(wf: WorkflowContext) -> int:
    """One map of ``items`` no-op activity jobs, run by every worker."""
    return sum(wf.map("items", noop_item, list(range(wf.input["items"]))))


@workflow("wfbench.replay", version=1)
def replay(wf: WorkflowContext) -> int:
    """``steps`` recorded checkpoints, then a wait: the advance after the signal
    replays them all."""
    for index in range(wf.input["steps"]):
        wf.step(f"s{index}", nothing, index)
    wf.wait_for_signal("go")
    return int(wf.input["steps"])


@workflow("wfbench.signal", version=1)
def signalled(wf: WorkflowContext) -> Any:
    """Wait for a signal, then one inline step (its start time is the latency's end)."""
    payload = wf.wait_for_signal("go")
    return wf.step("after", nothing, payload["n"])


def report_start(marker: int) -> int:
    """An inline step that tells the soak's harness when its advance ran it."""
    probe.started(marker)
    return marker


@workflow("wfbench.soak", version=1)
def soaked(wf: WorkflowContext) -> int:
    """The workflows soak's run: a timer, then a signal, each followed by an inline
    step whose start is the end of that advance's latency (``benchmarks.soak_workflows``)."""
    marker = int(wf.input["marker"])
    wf.sleep("nap", wf.input["sleep"])
    wf.step("woke", report_start, marker)
    wf.wait_for_signal("go")
    return int(wf.step("signalled", report_start, marker + 1))
