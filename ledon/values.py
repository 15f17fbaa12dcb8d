"""What leaves the apps' stores: a stored row as its frozen value (or one value made
from another that has the same fields), the outcome of a fenced write, and the outcome
of a scoped cancel."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

#: The init fields of each class seen, read once.
_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.init)
    return names


def from_row[T](cls: type[T], row: object, /, **converted: Any) -> T:
    """The dataclass ``cls`` of ``row`` (a model instance, or a value with the same
    attributes): each field is the row's attribute of the same name, unless
    ``converted`` gives it (an enum member, a tuple of a JSON list, a value the row does
    not hold). A field with a default is read from the row too: one the row lacks is an
    AttributeError, never a silent default."""
    values = {name: getattr(row, name) for name in _field_names(cls) if name not in converted}
    return cls(**values, **converted)


class FencedOutcome(enum.Enum):
    """The outcome of a write fenced by a token or a lease (a job attempt's finish, an
    outbox delivery's record). Its ``STALE`` member is false: the token or the lease
    was no longer current, and nothing changed. Every other member is true, so that
    ``if outcome:`` reads "it was written"."""

    def __bool__(self) -> bool:
        return self.name != "STALE"


class CancelOutcome(enum.StrEnum):
    """What a scoped cancel did: :meth:`jobs.JobScope.cancel` (or the tasks backend's
    cancel) for a job, :meth:`workflows.WorkflowScope.cancel` for a run. Both apps
    export it."""

    #: It was not running (a Queued job, a Waiting run) and is now Cancelled.
    CANCELLED = "cancelled"
    #: It is running and was asked to stop: a job's handler sees
    #: ``cancel_requested``; a run ends Cancelled at its next checkpoint.
    REQUESTED = "requested"
    #: It had finished already: nothing changed.
    ALREADY_FINISHED = "already_finished"
