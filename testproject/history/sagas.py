"""The workload's saga (imported at start-up through ``SAGAS["AUTODISCOVER_MODULE"]``):
three steps, the first two compensated; an instance whose data says ``fail`` fails at
its last step. Every action and compensation records its effect in its own
transaction, which commits with the step's mark (once)."""

from __future__ import annotations

from collections.abc import Callable

from sagas import SagaContext, saga

from .models import Effect
from .tasks import record
from .workload import SAGA, SAGA_STEPS


class Declined(Exception):
    """The failure a failing instance's last step raises."""


def action(name: str) -> Callable[[SagaContext], None]:
    def run(ctx: SagaContext) -> None:
        record(Effect.Kind.SAGA_STEP, ctx.data["key"], name)
        if name == SAGA_STEPS[-1] and ctx.data["fail"]:
            raise Declined(f"{ctx.data['key']}: declined at {name}")

    return run


def compensation(name: str) -> Callable[[SagaContext], None]:
    def run(ctx: SagaContext) -> None:
        record(Effect.Kind.COMPENSATION, ctx.data["key"], name)

    return run


saga(SAGA).step("reserve", action("reserve"), compensate=compensation("reserve")).step(
    "charge", action("charge"), compensate=compensation("charge")
).step("ship", action("ship"))
