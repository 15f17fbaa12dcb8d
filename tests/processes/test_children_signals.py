"""The children the tests start hear SIGINT as they would from a terminal's Ctrl-C,
however the test run itself was started (``tests.support.procs.give_children_default_sigint``).

A test run started in the background of a script (``scripts/test.sh > log &``)
inherits SIGINT ignored, and so did every child it started: ``runserver``, which
sets no handler of its own, then never stopped on the SIGINT the pooler tests send it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import ManageProcess, give_children_default_sigint

pytestmark = pytest.mark.slow

#: Prints what the child does on SIGINT: "default" (KeyboardInterrupt), "ignored", or
#: another handler.
SHOW_SIGINT = (
    "import signal; h = signal.getsignal(signal.SIGINT); "
    "print({signal.default_int_handler: 'default', signal.SIG_IGN: 'ignored'}.get(h, h))"
)


def sigint_of_child(tmp_path: Path, *, real: bool) -> str:
    child = ManageProcess(tmp_path, "shell", "-v", "0", "-c", SHOW_SIGINT, real=real)
    try:
        assert child.wait() == 0, child.output
        return child.output.strip()
    finally:
        child.close()


@pytest.fixture
def started_with_sigint_ignored() -> Iterator[None]:
    """This test process as one started by ``cmd &`` in a script: SIGINT ignored."""
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


def test_the_children_of_this_run_stop_on_sigint(tmp_path):
    """Through the fork server, as the real-process tests start them."""
    assert sigint_of_child(tmp_path, real=False) == "default"


@pytest.mark.usefixtures("started_with_sigint_ignored")
def test_a_run_that_inherited_sigint_ignored_gives_its_children_the_default(tmp_path):
    """What each test process does as it starts (``pytest_configure``), for a fresh
    interpreter that inherits this process's SIGINT: without it, the child ignores
    SIGINT too."""
    assert sigint_of_child(tmp_path, real=True) == "ignored"
    give_children_default_sigint()
    assert sigint_of_child(tmp_path, real=True) == "default"
