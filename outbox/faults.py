"""Named fault points at the dispatcher's commit boundaries (see ``ledon.faults``).

Crash tests register a hook that raises, blocks or kills the process at one named
point, so that a crash happens exactly there instead of after a hopeful sleep.

Points:

``outbox.dispatcher.claimed``
    a batch is claimed and committed; nothing is published yet.
``outbox.in_process.delivered``
    the in-process transport delivered one message of a batch (``index`` counts
    from 1); the batch is not yet recorded.
``outbox.dispatcher.published``
    the transport confirmed the batch; nothing is recorded yet.
``outbox.store.recording``
    a batch's outcomes are written in its recording transaction, not yet committed
    (the keys of its delivered messages are locked on PostgreSQL).
``outbox.dispatcher.recorded``
    the batch's outcomes are committed.
``outbox.dispatcher.recovering``
    at start-up (or after a batch failed on the database), before the batches this
    dispatcher id still holds are released.
``outbox.consumer.received``
    ``consume_events`` received a message; nothing is handled yet.
``outbox.consumer.committed``
    a received message's transaction (inbox record and handlers' work) committed;
    it is not acknowledged yet.
``outbox.consumer.acknowledged``
    the message was acknowledged (or parked, or skipped).
"""

from __future__ import annotations

# The machinery is shared by every app (``ledon.faults``); the outbox's points are
# listed above.
from ledon.faults import FaultHook, add_fault_hook, fault_point, remove_fault_hook

__all__ = ["FaultHook", "add_fault_hook", "fault_point", "remove_fault_hook"]
