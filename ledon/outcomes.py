"""What the apps' fenced writes share: an outcome whose ``STALE`` member is false."""

from __future__ import annotations

import enum


class FencedOutcome(enum.Enum):
    """The outcome of a write fenced by a token or a lease (a job attempt's finish, an
    outbox delivery's record). Its ``STALE`` member is false: the token or the lease
    was no longer current, and nothing changed. Every other member is true, so that
    ``if outcome:`` reads "it was written"."""

    def __bool__(self) -> bool:
        return self.name != "STALE"
