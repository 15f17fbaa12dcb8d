"""The inbox: process each message once per consumer.

::

    with unit_of_work() as uow, consume("billing", message_id) as fresh:
        if fresh:
            Invoice.objects.create(...)
            stage_job(...)
            uow.add_integration_event(InvoiceIssued(...))

``consume`` records (consumer, message id) in the open transaction. ``fresh`` is
False when the record already exists — a redelivery — and the handler skips its
work. The record, the business rows, staged jobs and new outbox messages commit or
roll back together: an exception escaping the block dooms the transaction even if
an outer block catches it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import transaction

from ledon.db import alias_for

from . import store, validation
from .models import InboxMessage


@contextmanager
def consume(
    consumer: str, message_id: uuid.UUID | str, *, using: str | None = None
) -> Iterator[bool]:
    """Record that ``consumer`` processes ``message_id``; yield whether it is new.

    Must run inside ``transaction.atomic`` or a unit of work on ``using`` (raises
    :class:`~outbox.exceptions.TransactionRequired` otherwise).
    """
    consumer = validation.text(consumer, "consumer", validation.MAX_CONSUMER_LENGTH)
    if isinstance(message_id, uuid.UUID):
        message_id = str(message_id)
    message_id = validation.text(message_id, "message id", validation.MAX_MESSAGE_ID_LENGTH)
    alias = using or alias_for(InboxMessage)
    fresh = store.record_inbox(consumer, message_id, using=alias)
    try:
        yield fresh
    except BaseException:
        transaction.set_rollback(True, using=alias)
        raise
