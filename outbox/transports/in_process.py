"""The default transport: deliver each message to ``event_bus`` in the dispatcher's
process.

The event is rebuilt from its registered name and JSON; subscribers run while the
message's :class:`~outbox.types.Envelope` is available through
:func:`outbox.bus.current_envelope`. A message is confirmed only when every
subscriber returned: if one raised, the message is retried later and every
subscriber sees it again (de-duplicate with :func:`outbox.inbox.consume`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..bus import event_bus
from ..events import decode
from ..exceptions import InvalidEvent, UnknownEventType
from ..faults import fault_point
from ..types import DeliveryReport, Envelope
from .base import Transport


class InProcessTransport(Transport):
    name = "in-process"
    supports_cross_process = False
    # The dispatcher publishes one key's messages one at a time, in stored order, and
    # subscribers run while the message is published.
    supports_key_ordering = True
    supports_headers = True
    supports_partial_batches = True

    def publish(self, messages: Sequence[Envelope]) -> Sequence[DeliveryReport]:
        reports = []
        for index, envelope in enumerate(messages, start=1):
            reports.append(self._deliver(envelope))
            fault_point("outbox.in_process.delivered", index=index, envelope=envelope)
        return reports

    def _deliver(self, envelope: Envelope) -> DeliveryReport:
        try:
            event = decode(envelope.event_type, envelope.payload_json)
        except UnknownEventType as exc:
            # Perhaps this process runs older code than the producer: retry.
            return DeliveryReport.failed(envelope.message_id, str(exc))
        except InvalidEvent as exc:
            return DeliveryReport.failed(envelope.message_id, str(exc), permanent=True)
        result = event_bus.publish(event, envelope=envelope)
        if not result.ok:
            return DeliveryReport.failed(
                envelope.message_id, f"subscriber failed: {result.describe_failures()}"
            )
        return DeliveryReport.delivered(envelope.message_id)
