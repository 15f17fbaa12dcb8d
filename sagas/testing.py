"""Helpers for testing code that defines and runs sagas.

::

    from sagas.testing import drive_pending_sagas, temporary_saga

    def test_an_order_started_in_a_view_is_fulfilled(client):
        client.post("/orders/", {...})         # calls start_saga(...) in its transaction
        stats = drive_pending_sagas()          # what recover_sagas would do, here
        assert stats.succeeded == 1

``run_saga`` works inside ordinary (non-transactional) tests too: when the only open
transaction is the test case's, which other connections cannot see, each step's thread
borrows the caller's connection. A step that ignores its cancellation is then waited
for before it is treated as failed. Test crashes and leases with ``transaction=True``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .registry import SagaDefinition, _registry, _registry_lock
from .runner import RecoveryStats, SagaRunner


def drive_pending_sagas(**kwargs: Any) -> RecoveryStats:
    """Claim and drive every instance that ``recover_sagas`` would, in this thread,
    until none is left; its statistics. Keyword arguments go to :class:`SagaRunner`."""
    kwargs.setdefault("runner_id", "test-runner")
    return SagaRunner(burst=True, **kwargs).run()


@contextmanager
def temporary_saga(name: str) -> Iterator[SagaDefinition]:
    """Register a saga for the duration of the block (replacing one of the same name,
    which is restored afterwards, without a warning)::

        with temporary_saga("checkout") as checkout:
            checkout.step("pay", pay, compensate=refund)
            run_saga("checkout", {...})
    """
    definition = SagaDefinition(name)
    with _registry_lock:
        previous = _registry.get(name)
        _registry[name] = definition
    try:
        yield definition
    finally:
        with _registry_lock:
            if previous is None:
                _registry.pop(name, None)
            else:
                _registry[name] = previous
