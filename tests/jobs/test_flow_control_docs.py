"""docs/flow-control.md stays true: its Python examples run as they are written, in
order, and do what the page says."""

from __future__ import annotations

import pytest

from jobs import JobScope
from jobs.conf import jobs_settings
from jobs.models import ScopeWeight
from tests.test_docs_examples import python_blocks, run_page

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "docs/flow-control.md"


def test_the_fair_share_examples_interleave_weigh_and_configure():
    blocks = python_blocks(PAGE)
    assert len(blocks) == 3
    namespace = run_page(PAGE)

    assert namespace["started_small"] == [2, 4]
    weight = ScopeWeight.objects.get(scope_hash=JobScope("tenant-big").scope_hash)
    assert weight.weight == 4
    # The settings block is a valid JOBS setting, and the queue it names is not fair.
    settings = jobs_settings.read(namespace["JOBS"])
    assert settings.QUEUES["ledger"]["fair"] is False
