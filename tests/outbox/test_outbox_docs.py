"""docs/outbox.md stays true: its examples marked with a source are the code the test
suite runs (testproject/orders), word for word."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from outbox import IntegrationEvent, store, unit_of_work
from outbox.models import OutboxMessage
from outbox.testing import RecordingTransport, capture_events, deliver_outbox
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


@dataclass(frozen=True)
class OrderShipped(IntegrationEvent, name="orders.shipped"):
    number: str


# The "Keep one entity's events in order" example of the guide, run as it is written there.
@pytest.mark.django_db(transaction=True)
def test_a_parked_message_halts_its_key_until_redelivered(settings):
    settings.OUTBOX = {"ENABLED": True}
    place_order("O-2", Decimal("10.00"))  # OrderPlaced, key="O-2"
    with unit_of_work() as uow:
        uow.add_integration_event(OrderShipped("O-2"), key="O-2")

    refusing = RecordingTransport(fail_with="broker said no", permanent=True)
    deliver_outbox(transport=refusing)  # OrderPlaced is parked: key "O-2" halts
    placed = OutboxMessage.objects.halting().get(key="O-2")
    assert OutboxMessage.objects.held().get(key="O-2").event_type == "orders.shipped"

    store.redeliver(placed.message_id)  # the cause is fixed: the key goes on, in order
    broker = RecordingTransport()
    deliver_outbox(transport=broker)
    assert [e.event_type for e in broker.published] == ["orders.placed", "orders.shipped"]
