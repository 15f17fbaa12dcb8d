"""Activities and maps: a checkpoint whose work is items, each run as a job of the
activity's own handler on any worker, and a fan-in once none is left running.

The first advance that reaches the checkpoint records it with its item count and,
in the same fenced transaction, its first items and their jobs (one bulk insert of
the items, one jobs batch that counts every item: :func:`workflows.store.
first_items`, so the workers start on them at once), then the rest in one more
transaction, which joins the batch (on SQLite, whose one write lock has no queue,
:func:`workflows.store.items_per_transaction` at a time), and the run waits without
a slot. An item that succeeds is
recorded by its job's own finish; the statement that ends the last item job queues
the batch's ``then`` job, which wakes the run (:func:`workflows.store.items_ended`).
Its replay reads the items with their jobs in one statement and gathers the results
in the items' order (or the first failure) into the checkpoint, copying how each
item ended onto its row in the same transaction.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ledon.bulk import let_writers_in
from ledon.errors import storable_text
from ledon.faults import fault_point

from . import store, validation
from .registry import ActivitySpec
from .replay import Replay, Suspend, outcome
from .types import Checkpoint, Item, StepKind, StepStatus, WaitKind


class Activities:
    """The activity and map checkpoints of one advance."""

    def __init__(self, replay: Replay) -> None:
        self._replay = replay
        #: The steps whose items this advance queued: it waits for them without
        #: looking (the last item to end wakes the run, whenever it ends).
        self._queued_here: set[int] = set()

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
        items and their jobs with it (one fenced transaction; on SQLite a large map's
        rest follows in batches: see :meth:`_queue`), without waiting for them: the
        checkpoint as it stands."""
        replay = self._replay
        checked, step = replay.reach(key, kind)
        if step is not None and step.status.is_finished:
            return step
        if step is None:
            store.check_item_count(checked, len(payloads))
            args = self._item_args(checked, kind, payloads)
            first = args[: store.first_items()]
            now = replay.now()
            # Unflushed: a crash of the server that took it back leaves the next
            # advance to record it again (it holds no result); an item job's claim,
            # a durable commit, flushes it first.
            with replay.write(unflushed=True):
                step = replay.insert(
                    checked,
                    kind,
                    StepStatus.RUNNING if args else StepStatus.SUCCEEDED,
                    now,
                    item_count=len(args),
                    result_json=None if args else "[]",
                )
                prefix = store.insert_items(replay.run, step, spec, first) if args else None
            replay.record(step)
            if len(first) < len(args):
                self._queue(step, spec, args, queued=len(first), prefix=prefix)
            if args:
                self._queued_here.add(step.pk)
            return step
        if step.status == StepStatus.RUNNING and store.items_queued(step) < step.item_count:
            # The driver that queued the items stopped between two batches.
            self._queue(step, spec, self._item_args(checked, kind, payloads))
        return step

    def ended(self, step: Checkpoint) -> Checkpoint | None:
        """``step`` (started) once every item has ended, its results gathered into it
        (see :meth:`_fan_in`); None while items are left (without a read for the
        items this advance has just queued: the last to end wakes the run)."""
        if step.status.is_finished:
            return step
        if step.pk in self._queued_here:
            return None
        scope_hash = self._replay.run.scope_hash
        if store.items_left(step, scope_hash):
            return None
        items = store.items_of(step, scope_hash)
        if len(items) < step.item_count or any(item.status == StepStatus.RUNNING for item in items):
            return None  # not all queued yet, or an item job retried between the reads
        return self._fan_in(step, items)

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
        prefix: str | None = None,
    ) -> None:
        """Queue the items (and their jobs) not queued yet (the first ``queued`` are;
        None: ask), :func:`workflows.store.items_per_transaction` per fenced
        transaction, into the jobs batch of the first (``prefix``: its job ids'
        prefix; None: ask), a pause for waiting writers between two
        (:func:`ledon.bulk.let_writers_in`)."""
        if queued is None:
            queued = store.items_queued(step)
        size = store.items_per_transaction() or len(args)
        while queued < len(args):
            batch = args[queued : queued + size]
            let_writers_in(transaction.get_connection(store.alias()))
            # Unflushed, as the first: lost in a crash of the server, the next advance
            # queues them again; an item job's claim, durable, flushes them first.
            with self._replay.write(unflushed=True):
                prefix = store.insert_items(
                    self._replay.run, step, spec, batch, start=queued, prefix=prefix
                )
            queued += len(batch)

    def _fan_in(self, step: Checkpoint, items: list[Item]) -> Checkpoint:
        """Every item has ended (``items``, as they stand): record the checkpoint
        Succeeded with the results in the items' order, or Failed with the first
        failure, and how each item ended on its row."""
        fault_point("workflows.map.fan_in", step=step.pk)
        replay = self._replay
        key, kind = step.key, step.kind
        failed = [item for item in items if item.status != StepStatus.SUCCEEDED]
        attempts = max(item.attempts for item in items)
        now = replay.now()
        # Unflushed: the results are read again from the item jobs, which are
        # durable, if a crash of the server takes it back; the run's next durable
        # commit (a step, its wait, its end) flushes it first.
        with replay.write(unflushed=True):
            store.record_items(step, items, now)
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
