"""Signals of the outbox engines, for optional layers such as the Prometheus metrics
(:mod:`outbox.observability.metrics`). A receiver that raises is logged and does not
stop the engine.
"""

from __future__ import annotations

from django.dispatch import Signal

#: A dispatcher recorded a batch's deliveries: ``sender=Dispatcher``, ``dispatcher``,
#: ``outcomes`` (a :class:`~outbox.types.RecordOutcome` per message id) and ``messages``
#: (the batch's envelopes).
deliveries_recorded = Signal()

#: A consumer is done with a message: ``sender=EventConsumer``, ``consumer``,
#: ``envelope`` (None for an undecodable one) and ``outcome`` (a
#: :class:`~outbox.consumer.ConsumeOutcome`).
message_consumed = Signal()
