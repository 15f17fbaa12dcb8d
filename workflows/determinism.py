"""The order rule of a replay: a body must reach its recorded checkpoints before any
new one.

A run's checkpoints are recorded in the order its body reached them, and a body is
deterministic given them, so every replay reaches them again in that order, and only
then reaches checkpoints that were never recorded. A replay that reaches a new
checkpoint while some recorded ones were not reached (skipped) has taken another
path than the one recorded: a random branch, a key built from the time. Running the
new checkpoint would run both paths' steps, so the run ends Failed with
:class:`~workflows.exceptions.NonDeterministicWorkflow` naming the skipped keys
instead.

One exception: the checkpoints a ``resume`` erased (a failed step, a timed-out
wait…) are recorded again where they stood, before the checkpoints recorded after
them; reaching one of them as new skips nothing.

:class:`RecordedOrder` is the one place that knows where a replay stands against
what was recorded (:meth:`RecordedOrder.beyond` tells whether recorded checkpoints
lie ahead, which a patch marker needs to tell old runs from new ones).
"""

from __future__ import annotations

from collections.abc import Iterable

#: How many skipped keys an error's message names (its ``skipped`` holds them all).
NAMED_IN_MESSAGE = 20


class RecordedOrder:
    """The checkpoints a run had recorded when its replay began, in the order
    recorded, and which of them this replay has reached: those in ``reached``, the
    set of every key the replay has reached, which the replay keeps (one set for
    both, and nothing more to keep per checkpoint passed: a long run's replay passes
    thousands)."""

    __slots__ = ("_keys", "_reached", "_reached_all", "_rerun")

    def __init__(self, keys: Iterable[str], reached: set[str], rerun: Iterable[str] = ()) -> None:
        self._keys = list(keys)
        self._reached = reached
        self._rerun = frozenset(rerun)
        #: Every recorded checkpoint was reached (it stays so: the keys are fixed
        #: and ``reached`` only grows).
        self._reached_all = not self._keys

    def beyond(self) -> bool:
        """Whether the run had recorded checkpoints this replay has not reached yet:
        the body stands where the run had been before, not at its frontier."""
        return bool(self.ahead())

    def ahead(self) -> tuple[str, ...]:
        """The recorded checkpoints this replay has not reached yet, in the order
        recorded."""
        if self._reached_all:
            return ()
        ahead = tuple(recorded for recorded in self._keys if recorded not in self._reached)
        self._reached_all = not ahead
        return ahead

    def skipped_by(self, key: str) -> tuple[str, ...]:
        """The recorded checkpoints a replay that now reaches the new checkpoint
        ``key`` has skipped, in the order recorded (none: it may go on)."""
        if key in self._rerun:
            return ()
        return self.ahead()


def skipped_detail(skipped: tuple[str, ...]) -> str:
    """What a :class:`~workflows.exceptions.NonDeterministicWorkflow` for a new
    checkpoint says about the recorded ones it skipped."""
    return (
        "reached as a new checkpoint while recorded checkpoints were skipped: "
        f"{named_keys(skipped)}; "
        "the body took another path than the one recorded (branch only on wf.input and "
        "recorded values, and build keys from them)"
    )


def named_keys(keys: tuple[str, ...]) -> str:
    """Checkpoint keys as a message names them: the first
    :data:`NAMED_IN_MESSAGE`, then how many more."""
    named = ", ".join(repr(key) for key in keys[:NAMED_IN_MESSAGE])
    more = len(keys) - NAMED_IN_MESSAGE
    if more > 0:
        named += f" and {more} more"
    return named
