"""A burst: engines that run side by side until none of them has anything left to do
(``run_jobs --burst``: the job worker, and the engines beside it that take part).

Each engine taking part is a :class:`Member` of one :class:`Burst`. The burst counts
the work its members did: a member calls :meth:`Member.worked` once something it did
is committed that another member may have to take up (an attempt's end, which may
have queued a batch's ``then`` job or the next advance of a workflow run; a saga step
that staged a job). Before each pass a member reads :meth:`Member.mark`; a pass that
found nothing to do and left nothing running calls :meth:`Member.quiet` with that
mark.

The burst is over once every member is quiet as of the current count: each found
nothing in a pass that began after the last thing any of them did, so each saw all
the others had committed. A member that will do nothing more the others could wait
for (its work is a single pass, or its engine ended) :meth:`~Member.leave`\\ s. Once
over, a burst stays over; every member is woken to see it and stops. The owner ends
it early (:meth:`Burst.end`) when it stops for another reason.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Burst:
    """The engines of one burst and the count of the work they did."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._members: list[Member] = []
        self._over = threading.Event()

    def join(self, name: str, wake: Callable[[], None]) -> Member:
        """A new member, ``name`` (for ``repr``), whose waits ``wake`` ends. Members join
        before the owner's first pass (from its start-up signal), so that none can be
        over before all took part."""
        member = Member(self, name, wake)
        with self._lock:
            self._members.append(member)
        return member

    @property
    def over(self) -> bool:
        return self._over.is_set()

    def end(self) -> None:
        """End the burst whatever its members' state (the owner stopped): every member
        is woken to see it."""
        self._finish()

    def _finish(self) -> None:
        self._over.set()
        self._wake_all()

    def _wake_all(self, but: Member | None = None) -> None:
        with self._lock:
            members = [m for m in self._members if m is not but]
        for member in members:
            member.wake()

    def _worked(self, by: Member) -> None:
        with self._lock:
            self._count += 1
        # The others' quiet passes began before this: each must look again.
        self._wake_all(but=by)

    def _quiet(self, member: Member, mark: int | None = None, *, leaving: bool = False) -> bool:
        with self._lock:
            if leaving:
                member.left = True
            else:
                member.quiet_at = mark
            over = all(m.left or m.quiet_at == self._count for m in self._members)
        if over and not self.over:
            self._finish()
        return over or self.over

    def _mark(self) -> int:
        with self._lock:
            return self._count


class Member:
    """One engine taking part in a :class:`Burst`."""

    def __init__(self, burst: Burst, name: str, wake: Callable[[], None]) -> None:
        self.burst = burst
        self.name = name
        self.wake = wake
        # Both under the burst's lock: the mark of this member's last pass that found
        # nothing (None: none yet), and whether it will do nothing more.
        self.quiet_at: int | None = None
        self.left = False

    def __repr__(self) -> str:
        return f"<burst member {self.name}>"

    @property
    def over(self) -> bool:
        """The burst is over: do no more, stop."""
        return self.burst.over

    def mark(self) -> int:
        """The count of the burst's work, read before a pass."""
        return self.burst._mark()

    def worked(self) -> None:
        """Something this member did is committed that another may have to take up
        (call it after the commit)."""
        self.burst._worked(self)

    def quiet(self, mark: int) -> bool:
        """This member's pass that began at ``mark`` found nothing to do and left nothing
        running. True if the burst is over (every member quiet as of the count)."""
        return self.burst._quiet(self, mark)

    def active(self) -> None:
        """This member took work again (a claim): its last quiet pass no longer holds."""
        self.burst._quiet(self, None)

    def leave(self) -> None:
        """This member will do nothing more the burst waits for."""
        self.burst._quiet(self, leaving=True)


def join_burst_of(owner: object, name: str, wake: Callable[[], None]) -> Member | None:
    """A new member ``name`` of the burst ``owner`` runs (its ``burst_round``: a
    ``run_jobs --burst`` worker's), for an engine started beside it; None if ``owner``
    runs no burst."""
    burst = getattr(owner, "burst_round", None)
    return burst.join(name, wake) if isinstance(burst, Burst) else None
