"""The Python examples of docs/workflows.md, run in order in one namespace as a reader
would run them, on SQLite and PostgreSQL; then what they promise is checked. The
"Test your workflows" example is a test module of its own: it runs again alone, in a
namespace of its own, and its tests are called."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs import JobScope
from workflows import RunStatus, WorkflowContext, WorkflowScope, start_workflow, workflow
from workflows.registry import unregister_workflow
from workflows.testing import TestClock, run_workflow

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "workflows.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def page_namespace() -> Iterator[dict[str, object]]:
    namespace: dict[str, object] = {"__name__": "docs_workflows_page"}
    blocks = BLOCK.findall(PAGE.read_text())
    assert len(blocks) >= 7
    try:
        for block in blocks:
            exec(compile(block, "docs/workflows.md", "exec"), namespace)
        yield namespace
    finally:
        for name in (
            "docs.fulfil",
            "docs.ship",
            "docs.charge",
            "docs.quote",
            "docs.book_courier",
            "docs.invoice",
        ):
            unregister_workflow(name, 1)


def test_the_workflows_page_runs_as_written(page_namespace):
    runs = WorkflowScope("tenant-1")
    # The page sent the payment's signal: the run goes to its end.
    fulfilled = run_workflow("tenant-1", "order-7", clock=TestClock())
    assert fulfilled.status == RunStatus.SUCCEEDED
    assert [step.key for step in fulfilled.steps] == [
        "reserve",
        "price",
        "cool-off",
        "paid",
        "ship",
    ]
    price = fulfilled.step("price")
    assert price.items.total == 2
    assert price.items.succeeded == 2
    # The staged run exists: its transaction committed.
    assert runs.get("order-8") is not None


def test_the_branches_example_gathers_an_activity_and_a_child(page_namespace):
    quote = run_workflow("tenant-1", "quote-7", clock=TestClock())
    assert quote.status == RunStatus.SUCCEEDED, quote.error
    assert quote.output == {"price": 300, "courier": "bike"}
    assert [(step.key, step.kind) for step in quote.steps] == [
        ("price", "activity"),
        ("courier", "child"),
    ]


def test_the_deadline_example_ends_the_rushed_run_timed_out(page_namespace):
    rushed = page_namespace["rushed"]
    clock = TestClock(rushed.created_at)
    clock.advance(3600)
    late = run_workflow("tenant-1", "quote-8", clock=clock)
    assert late.status == RunStatus.CANCELLED
    assert late.error.startswith("RunTimedOut: run 'quote-8' did not finish by its deadline")


def test_the_testing_example_is_a_test_module_that_stands_alone(page_namespace):
    (block,) = [b for b in BLOCK.findall(PAGE.read_text()) if "def test_" in b]
    module: dict[str, Any] = {"__name__": "test_docs_workflows"}
    exec(compile(block, "docs/workflows.md", "exec"), module)
    tests = [value for name, value in module.items() if name.startswith("test_")]
    assert len(tests) == 4
    for test in tests:
        test()
    charge = WorkflowScope("test-tenant").get("charge-1")
    assert charge.step("charge").status == "failed"
    assert charge.step("charge").attempts == 2


def test_current_activity_is_the_items_job_context(page_namespace):
    @workflow("docs.export", version=1)
    def export(wf: WorkflowContext) -> Any:
        return wf.map("rows", "docs.export_rows", [[{"id": 1}, {"id": 2}]])

    try:
        start_workflow("tenant-1", "export-1", "docs.export")
        run = run_workflow("tenant-1", "export-1", clock=TestClock())
    finally:
        unregister_workflow("docs.export", 1)
    assert run.output == [2]
    (item_job,) = JobScope("tenant-1").list(handler="docs.export_rows")
    assert (item_job.progress, item_job.progress_message) == (1.0, "2 of 2 rows")


def test_a_patch_on_the_page_takes_the_new_path_for_a_new_run(page_namespace):
    run = run_workflow("tenant-1", "invoice-1", clock=TestClock())
    assert run.status == RunStatus.SUCCEEDED
    assert run.output == 300
    assert [step.key for step in run.steps] == ["total", "patch:tax-2027", "tax", "grace"]


def test_a_fork_on_the_page_goes_on_from_its_step(page_namespace):
    run_workflow("tenant-1", "invoice-1", clock=TestClock())
    fork_from = page_namespace["fork_from"]
    assert fork_from("invoice-1", "never-reached") is None
    forked = fork_from("invoice-1", "grace")
    assert forked.run_id == "invoice-1-from-grace"
    assert [step.key for step in forked.steps] == ["total", "patch:tax-2027", "tax"]
    run = run_workflow("tenant-1", "invoice-1-from-grace", clock=TestClock())
    assert run.status == RunStatus.SUCCEEDED
    assert run.output == 300
