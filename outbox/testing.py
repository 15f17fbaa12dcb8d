"""Helpers for testing code that uses units of work, events and the outbox.

::

    from outbox.testing import capture_events, deliver_outbox

    def test_placing_an_order_bills_it():
        with capture_events(OrderPlaced) as placed:
            place_order(...)
            deliver_outbox()           # run a dispatcher until nothing is due
        assert [e.order_id for e in placed] == [7]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .bus import event_bus
from .dispatcher import Dispatcher, DispatcherStats
from .events import Event
from .faults import add_fault_hook, remove_fault_hook
from .transports.base import Transport
from .types import DeliveryReport, Envelope


@contextmanager
def capture_events(*event_types: type[Event]) -> Iterator[list[Event]]:
    """Collect the events published on ``event_bus`` (of ``event_types``, default all)
    while the block runs, in publishing order."""
    captured: list[Event] = []
    lock = threading.Lock()

    def record(event: Event) -> None:
        with lock:
            captured.append(event)

    types = event_types or (Event,)
    for event_type in types:
        event_bus.subscribe(event_type, record)
    try:
        yield captured
    finally:
        for event_type in types:
            event_bus.unsubscribe(event_type, record)


def deliver_outbox(*, transport: Transport | None = None, **kwargs: Any) -> DispatcherStats:
    """Run a dispatcher in this thread until no message is due; its statistics."""
    kwargs.setdefault("dispatcher_id", "test-dispatcher")
    dispatcher = Dispatcher(burst=True, listen=False, transport=transport, **kwargs)
    return dispatcher.run()


class RecordingTransport(Transport):
    """Keeps every published message in ``published``; fails on demand.

    ``fail_with`` (an error text, or a callable taking the envelope and returning
    an error text or None) makes messages fail; ``permanent`` marks those failures
    permanent; ``raise_with`` makes the whole batch raise.
    """

    name = "recording"
    supports_headers = True

    def __init__(
        self,
        *,
        fail_with: str | Callable[[Envelope], str | None] | None = None,
        permanent: bool = False,
        raise_with: BaseException | None = None,
    ) -> None:
        super().__init__()
        self.published: list[Envelope] = []
        self.batches: list[tuple[Envelope, ...]] = []
        self.fail_with = fail_with
        self.permanent = permanent
        self.raise_with = raise_with
        self._lock = threading.Lock()

    def publish(self, messages: Sequence[Envelope]) -> Sequence[DeliveryReport]:
        if self.raise_with is not None:
            raise self.raise_with.with_traceback(None)
        reports = []
        with self._lock:
            self.batches.append(tuple(messages))
            for envelope in messages:
                error = self.fail_with(envelope) if callable(self.fail_with) else self.fail_with
                if error:
                    reports.append(
                        DeliveryReport.failed(envelope.message_id, error, permanent=self.permanent)
                    )
                else:
                    self.published.append(envelope)
                    reports.append(DeliveryReport.delivered(envelope.message_id))
        return reports


@contextmanager
def fault_at(
    point: str,
    error: BaseException | Callable[[dict[str, Any]], None],
    *,
    when: Callable[[dict[str, Any]], bool] | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """Raise ``error`` (or call it with the context) at the named fault point while
    the block runs, each time ``when(context)`` is true. Yields the contexts seen
    at that point."""
    seen: list[dict[str, Any]] = []

    def hook(name: str, context: dict[str, Any]) -> None:
        if name != point:
            return
        seen.append(context)
        if when is None or when(context):
            if isinstance(error, BaseException):
                raise error
            error(context)

    add_fault_hook(hook)
    try:
        yield seen
    finally:
        remove_fault_hook(hook)
