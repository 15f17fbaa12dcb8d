"""What a step's action or compensation receives."""

from __future__ import annotations

import threading
import uuid
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

from .exceptions import StepCancelled

if TYPE_CHECKING:
    from outbox import UnitOfWork


@dataclass(kw_only=True, eq=False)
class SagaContext:
    """The context of one step (or one compensation) of one saga instance.

    ``data`` is the instance's JSON dict: what earlier steps wrote is there, and what
    this step writes is stored with its completion, in its transaction. If the step
    fails, its changes to ``data`` are dropped with the rest of its transaction.

    ``unit_of_work`` is the step's own unit of work: rows written and events added
    through it (or inside any ``unit_of_work()`` block the step opens, which joins it)
    commit together with the step's completion mark, or not at all.

    A step that may run long should watch its cancellation signal
    (``cancel_requested``, ``raise_if_cancelled()``, ``wait_for_cancel()``): it is set
    when the step's timeout passes or its runner loses the instance. A step that
    ignores it is treated as failed after a grace period, and its transaction can no
    longer commit the step's completion.
    """

    instance_id: uuid.UUID
    saga_name: str
    step: str
    data: dict[str, Any]
    unit_of_work: UnitOfWork
    #: True while running a compensation rather than the step's action.
    compensating: bool = False
    #: The try of this compensation (1 for actions and first tries).
    attempt: int = 1
    #: The step's cancellation signal (the runner's; a new one by default).
    cancel: InitVar[threading.Event | None] = None
    _cancel: threading.Event = field(init=False)

    def __post_init__(self, cancel: threading.Event | None) -> None:
        self._cancel = cancel or threading.Event()

    def __repr__(self) -> str:
        what = "compensation" if self.compensating else "step"
        return f"<SagaContext {self.saga_name} {self.instance_id} {what} {self.step!r}>"

    @property
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise :class:`~sagas.exceptions.StepCancelled` if the step should stop."""
        if self._cancel.is_set():
            raise StepCancelled(f"step {self.step!r} of saga {self.saga_name!r} was cancelled")

    def wait_for_cancel(self, timeout: float | None = None) -> bool:
        """Block until cancellation is signalled or ``timeout`` passes; True if signalled.
        Use it instead of ``time.sleep`` in steps that wait."""
        return self._cancel.wait(timeout)

    def signal_cancel(self) -> None:
        """The runner's side: ask the step to stop."""
        self._cancel.set()
