"""The Python examples of docs/workflows.md, run in order in one namespace as a reader
would run them, on SQLite and PostgreSQL; then what they promise is checked."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from workflows import RunStatus, WorkflowScope
from workflows.registry import unregister_workflow

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def page_namespace() -> Iterator[dict[str, object]]:
    namespace: dict[str, object] = {"__name__": "docs_workflows_page"}
    yield namespace
    for name in ("docs.fulfil", "docs.ship", "docs.charge"):
        unregister_workflow(name, 1)


def test_the_workflows_page_runs_as_written(page_namespace):
    blocks = BLOCK.findall((ROOT / "docs" / "workflows.md").read_text())
    assert len(blocks) >= 6
    for block in blocks:
        exec(compile(block, "docs/workflows.md", "exec"), page_namespace)
    runs = WorkflowScope("tenant-1")
    fulfilled = runs.get("order-7")
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
    assert runs.get("charge-1").step("charge").status == "failed"
    assert runs.get("charge-1").step("charge").attempts == 2
