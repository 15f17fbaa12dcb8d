"""Activities and maps: a checkpoint whose work is items, each run as a job of the
activity's own handler on any worker, and a fan-in once none is left running.

The first advance that reaches the checkpoint records it with its item count and
queues its items with their jobs, :data:`workflows.store.ITEM_BATCH` per fenced
transaction, and the run waits without a slot. Items end on their own rows; the last
to end wakes the run (:func:`workflows.store.fan_in`), whose replay gathers the
results in the items' order (or the first failure) into the checkpoint.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ledon.bulk import let_writers_in
from ledon.errors import storable_text

from . import store, validation
from .registry import ActivitySpec
from .replay import Replay, Suspend, outcome
from .types import Checkpoint, StepKind, StepStatus, WaitKind


class Activities:
    """The activity and map checkpoints of one advance."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay

    def run(self, key: str, kind: StepKind, spec: ActivitySpec, payloads: list[Any]) -> Any:
        """The checkpoint ``key`` of ``kind`` (an activity: one item; a map: one per
        payload): its recorded value (an activity's result, a map's list of
        results) or failure, or the run waits for its items."""
        step = self.start(key, kind, spec, payloads)
        ended = self.ended(step)
        if ended is None:
            raise Suspend(WaitKind.ITEMS, step.key)
        return outcome(ended)

    def start(
        self, key: str, kind: StepKind, spec: ActivitySpec, payloads: list[Any]
    ) -> Checkpoint:
        """Reach the checkpoint ``key`` and, the first time, record it and queue its
        items and their jobs (in the advance's fenced transactions), without waiting
        for them: the checkpoint as it stands."""
        replay = self._replay
        checked, step = replay.reach(key, kind)
        if step is not None and step.status.is_finished:
            return step
        if step is None:
            store.check_item_count(checked, len(payloads))
            args = self._item_args(checked, kind, payloads)
            now = replay.now()
            with replay.write():
                step = replay.insert(
                    checked,
                    kind,
                    StepStatus.RUNNING if args else StepStatus.SUCCEEDED,
                    now,
                    item_count=len(args),
                    result_json=None if args else "[]",
                )
                if args:
                    store.insert_items(replay.run, step, spec, args[: store.ITEM_BATCH])
            replay.record(step)
            if args:
                self._queue(step, spec, args, queued=min(len(args), store.ITEM_BATCH))
            return step
        if step.status == StepStatus.RUNNING and store.items_queued(step) < step.item_count:
            # The driver that queued the items stopped between two batches.
            self._queue(step, spec, self._item_args(checked, kind, payloads))
        return step

    def ended(self, step: Checkpoint) -> Checkpoint | None:
        """``step`` (started) once every item has ended, its results gathered into it
        (see :meth:`_fan_in`); None while items are left."""
        if step.status.is_finished:
            return step
        if store.items_left(step) > 0:
            return None
        return self._fan_in(step)

    @staticmethod
    def _item_args(key: str, kind: StepKind, payloads: list[Any]) -> list[str]:
        return [
            validation.to_json(payload, f"the arguments of {kind} {key!r} item {index}")
            for index, payload in enumerate(payloads)
        ]

    def _queue(
        self,
        step: Checkpoint,
        spec: ActivitySpec,
        args: list[str],
        queued: int | None = None,
    ) -> None:
        """Queue the items (and their jobs) not queued yet (the first ``queued``
        are; None: ask), :data:`workflows.store.ITEM_BATCH` per fenced transaction: a
        large map never holds the write lock long."""
        if queued is None:
            queued = store.items_queued(step)
        while queued < len(args):
            batch = args[queued : queued + store.ITEM_BATCH]
            let_writers_in(transaction.get_connection(store.alias()))
            with self._replay.write():
                store.insert_items(self._replay.run, step, spec, batch, start=queued)
            queued += len(batch)

    def _fan_in(self, step: Checkpoint) -> Checkpoint:
        """Every item has ended: record the checkpoint Succeeded with the results in
        the items' order, or Failed with the first failure."""
        replay = self._replay
        key, kind = step.key, step.kind
        items = store.items_of(step)
        failed = [item for item in items if item.status != StepStatus.SUCCEEDED]
        attempts = max(item.attempts for item in items)
        now = replay.now()
        with replay.write():
            if failed:
                first = failed[0]
                error_type = first.error_type or "Cancelled"
                message = first.error or f"item {first.index} was {first.status}"
                if len(items) > 1:
                    message = (
                        f"{len(failed)} of {len(items)} items failed; item {first.index}: {message}"
                    )
                step = replay.move(
                    step,
                    StepStatus.RUNNING,
                    status=StepStatus.FAILED,
                    error_type=error_type[:200],
                    error=storable_text(message),
                    attempts=attempts,
                    finished_at=now,
                )
            else:
                results = [validation.from_json(item.result_json) for item in items]
                value = results if kind == StepKind.MAP else results[0]
                step = replay.move(
                    step,
                    StepStatus.RUNNING,
                    status=StepStatus.SUCCEEDED,
                    result_json=validation.to_json(value, f"the result of {kind} {key!r}"),
                    attempts=attempts,
                    finished_at=now,
                )
        return replay.record(step)
