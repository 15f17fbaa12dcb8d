"""Engines beside their owners: one per owner, found by its owner while it runs,
stopped (and waited for) when its owner stops."""

from __future__ import annotations

import threading

from ledon.beside import Beside


class Loop:
    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.started = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        self.started.set()
        self.stopping.wait(30)


def test_an_engine_is_found_by_its_owner_until_it_is_stopped():
    beside: Beside[Loop] = Beside("test-beside")
    owner, other = object(), object()
    loop = Loop()
    beside.start(owner, loop, loop.run)
    assert loop.started.wait(10)
    assert beside.engine_of(owner) is loop
    assert beside.engine_of(other) is None
    assert beside.stop(owner, timeout=10) is None  # it ended
    assert loop.stopping.is_set()
    assert beside.engine_of(owner) is None
