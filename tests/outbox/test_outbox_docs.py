"""docs/outbox.md stays true: its examples marked with a source are the code the test
suite runs (testproject/orders), word for word."""

from __future__ import annotations

import re
import textwrap
from decimal import Decimal
from pathlib import Path

import pytest

from outbox.testing import capture_events, deliver_outbox
from testproject.orders.events import OrderPlaced
from testproject.orders.services import place_order

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "outbox.md"
SOURCED_BLOCK = re.compile(r"<!-- source: (?P<path>\S+) -->\n```python\n(?P<code>.*?)```", re.S)


def sourced_blocks() -> list[tuple[str, str]]:
    return [(m["path"], m["code"]) for m in SOURCED_BLOCK.finditer(DOC.read_text())]


def test_the_guide_has_sourced_examples():
    paths = {path for path, _ in sourced_blocks()}
    assert paths == {
        "testproject/orders/events.py",
        "testproject/orders/services.py",
        "tests/outbox/test_outbox_docs.py",
    }


@pytest.mark.parametrize(("path", "code"), sourced_blocks())
def test_each_sourced_example_is_in_its_file(path: str, code: str):
    source = (ROOT / path).read_text()
    assert textwrap.dedent(code) in source, f"docs/outbox.md drifted from {path}"


# The "Test your code" example of the guide, run as it is written there.
@pytest.mark.django_db(transaction=True)
def test_placing_an_order_bills_it(settings):
    settings.OUTBOX = {"ENABLED": True}
    with capture_events(OrderPlaced) as placed:
        place_order("O-1", Decimal("10.00"))
        deliver_outbox()  # a dispatcher in this thread, until none is due
    assert [e.number for e in placed] == ["O-1"]
