"""The upgrade check: would the code installed now replay every run in flight as it
was recorded?

Each run in flight (Waiting, Running or Failed) is replayed against its registered
body with a :class:`CheckReplay`: a recorded checkpoint returns its recorded value
(or raises its recorded failure) as in any replay, and the first checkpoint that is
not recorded, or not finished, ends the replay — nothing runs, nothing is written,
and what the body writes by itself is rolled back with the transaction the whole
check runs in. A run replays cleanly when its replay reaches that frontier, or
returns, without contradicting what it recorded, or when a Failed run replays to
its own recorded failure. Otherwise its first divergence is reported
(:class:`Divergence`): a recorded key reached as another kind, a key used twice,
recorded checkpoints skipped, a version the code no longer defines, or an error the
run did not record.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import DatabaseError, InterfaceError, OperationalError, transaction

from . import registry, store
from .context import WorkflowContext
from .determinism import named_keys
from .engine import current_time
from .exceptions import NonDeterministicWorkflow, StepFailed
from .replay import Fenced, Replay, error_parts
from .types import Checkpoint, RunStatus, StepKind

#: Runs read (and replayed) per batch: two queries each.
BATCH = 500


class Reason(enum.StrEnum):
    """Why a run would not replay as it was recorded."""

    #: A recorded key reached as another kind of checkpoint.
    ANOTHER_KIND = "another_kind"
    #: One key reached twice.
    USED_TWICE = "used_twice"
    #: A new checkpoint (or the body's end) reached while recorded ones were skipped.
    SKIPPED = "skipped"
    #: The code installed defines no workflow of the run's (name, version).
    MISSING_VERSION = "missing_version"
    #: The body raises an error the run did not record.
    RAISES = "raises"


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """The first place a run's replay leaves what the run recorded."""

    scope_hash: str
    run_id: str
    name: str
    version: int
    #: The checkpoint where it diverges ("" for the body's end or its start).
    key: str
    reason: Reason
    #: The recorded keys skipped (for :attr:`Reason.SKIPPED`), in the order recorded.
    skipped: tuple[str, ...] = ()
    #: What the replay met, in words (an error's type and message).
    detail: str = ""

    def describe(self) -> str:
        """The reason in words."""
        match self.reason:
            case Reason.SKIPPED:
                where = "reached as a new checkpoint" if self.key else "the body returns"
                return f"{where} while recorded checkpoints were skipped: " + named_keys(
                    self.skipped
                )
            case Reason.MISSING_VERSION:
                return f"the code defines no workflow {self.name!r} version {self.version}"
            case Reason.RAISES:
                return f"raises {self.detail}, which the run did not record"
        return self.detail


@dataclass(slots=True, kw_only=True)
class Verdict:
    """The check of one (name, version): how many runs in flight it replayed, and
    those that would not replay as recorded."""

    name: str
    version: int
    checked: int = 0
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def clean(self) -> int:
        return self.checked - len(self.divergences)


class Frontier(BaseException):
    """The replay reached a checkpoint that is not recorded, or not finished: it ends
    there (a ``BaseException``: a body's ``except Exception`` must not swallow it)."""


class CheckReplay(Replay):
    """A replay that runs nothing and writes nothing: recorded checkpoints give their
    values, the first one with work to do ends it (:class:`Frontier`)."""

    def __init__(self, found: store.RunInFlight) -> None:
        super().__init__(store.Driver(found.run, ""), current_time, found.steps)
        #: The first contradiction met, with the kind the body reached its key as.
        self.contradiction: tuple[NonDeterministicWorkflow, StepKind] | None = None

    def cancel_requested(self) -> bool:
        return False

    def cancelled_at(self, key: str, kind: StepKind) -> bool:
        return False

    def reach(self, key: object, kind: StepKind) -> tuple[str, Checkpoint | None]:
        try:
            checked, step = super().reach(key, kind)
        except NonDeterministicWorkflow as exc:
            if self.contradiction is None:
                self.contradiction = (exc, kind)
            raise
        if step is None or not step.status.is_finished:
            raise Frontier
        return checked, step

    def write(self, *, unflushed: bool = False) -> Fenced:
        raise Frontier  # a checkpoint about to be recorded: never, in a check


def check_runs(batch: int = BATCH) -> list[Verdict]:
    """Replay every run in flight (see the module docstring) inside one transaction
    that is rolled back; the verdicts by (name, version), in name and version order."""
    verdicts: dict[tuple[str, int], Verdict] = {}
    with transaction.atomic(using=store.alias()):
        for runs in store.runs_in_flight(batch):
            for found in runs:
                run = found.run
                verdict = verdicts.setdefault(
                    (run.name, run.version), Verdict(name=run.name, version=run.version)
                )
                verdict.checked += 1
                divergence = _checked_alone(found)
                if divergence is not None:
                    verdict.divergences.append(divergence)
        transaction.set_rollback(True, using=store.alias())
    return [verdicts[key] for key in sorted(verdicts)]


def _checked_alone(found: store.RunInFlight) -> Divergence | None:
    """:func:`check_run` in a savepoint of its own: a body whose own query fails is
    reported (its error rolled back with the savepoint) and the check goes on; a lost
    connection stops the check."""
    try:
        with transaction.atomic(using=store.alias()):
            return check_run(found)
    except (OperationalError, InterfaceError):
        raise
    except DatabaseError as exc:
        return _divergence(found, "", Reason.RAISES, detail=": ".join(error_parts(exc)))


def check_run(found: store.RunInFlight) -> Divergence | None:
    """The first divergence of one run's replay, or None if it replays cleanly."""
    run = found.run
    spec = registry.find_workflow(run.name, run.version)
    if spec is None:
        return _divergence(found, "", Reason.MISSING_VERSION)
    replay = CheckReplay(found)
    ctx = WorkflowContext(replay.driver, current_time, replay)
    returned = False
    try:
        spec.func(ctx)
        returned = True
    except Frontier:
        pass  # its replay stops where the run stands: what lies beyond is not reached
    except DatabaseError:
        raise  # the query failed: its transaction can run nothing more
    except Exception as exc:
        failed = exc.key if isinstance(exc, StepFailed) else ctx.checkpoint_of(exc)
        if replay.contradiction is None:
            if found.status is RunStatus.FAILED and failed == found.failed_step:
                return None  # its own recorded failure
            return _divergence(found, failed, Reason.RAISES, detail=": ".join(error_parts(exc)))
    if replay.contradiction is not None:
        return _contradiction(found, replay, *replay.contradiction)
    if not returned or not replay.beyond():
        return None
    # The body returns while recorded checkpoints were not reached: it would end the
    # run having skipped them.
    return _divergence(found, "", Reason.SKIPPED, skipped=replay.ahead())


def _contradiction(
    found: store.RunInFlight, replay: Replay, error: NonDeterministicWorkflow, kind: StepKind
) -> Divergence | None:
    if found.status is RunStatus.FAILED and error.key == found.failed_step:
        return None  # it failed of this very contradiction
    if error.skipped:
        return _divergence(found, error.key, Reason.SKIPPED, skipped=error.skipped)
    recorded = replay.step_of(error.key)
    reason = (
        Reason.ANOTHER_KIND if recorded is not None and recorded.kind != kind else Reason.USED_TWICE
    )
    return _divergence(found, error.key, reason, detail=error.detail)


def _divergence(
    found: store.RunInFlight,
    key: str,
    reason: Reason,
    *,
    skipped: Iterable[str] = (),
    detail: str = "",
) -> Divergence:
    run = found.run
    return Divergence(
        scope_hash=run.scope_hash,
        run_id=run.run_id,
        name=run.name,
        version=run.version,
        key=key,
        reason=reason,
        skipped=tuple(skipped),
        detail=detail,
    )
