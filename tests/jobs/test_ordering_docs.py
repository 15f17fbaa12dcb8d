"""docs/batches-and-sequences.md stays true: its Python examples run as they are
written, in order, and do what the page says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobs import JobStatus
from jobs.handlers import unregister
from tests.test_docs_examples import python_blocks, run_page

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "docs/batches-and-sequences.md"


@pytest.fixture
def page_handlers() -> Iterator[None]:
    """The page registers handlers: gone after the test."""
    yield
    for name in ("imports.row", "imports.done", "ledger.settle"):
        unregister(name, 1)


def test_the_batches_and_sequences_page_does_what_it_says(page_handlers: None) -> None:
    assert len(python_blocks(PAGE)) == 6
    namespace = run_page(PAGE)

    batch, done, then = namespace["batch"], namespace["done"], namespace["then"]
    assert (batch.created, batch.total, batch.status) == (True, 3, "open")
    assert (done.status, done.succeeded, done.pending) == ("done", 3, 0)
    assert then is not None
    assert (then.job_id, then.status) == ("import-9:then", JobStatus.QUEUED)

    assert [c.job_id for c in namespace["first"]] == ["posting-0"]
    assert namespace["order"] == ["posting-0", "posting-1", "posting-2"]

    assert namespace["waiting"] == []
    assert namespace["next_one"].job_id == "settle-1"
