"""What the handlers that are not no-ops do, the same in every system."""

from __future__ import annotations

#: The sleep of the 5 ms handlers, in seconds.
SLEEP_SECONDS = 0.005
#: Iterations of :func:`compute`: about 20 ms of one CPU on the machine the committed
#: results come from.
COMPUTE_ITERATIONS = 350_000


def compute() -> int:
    """Pure Python arithmetic, holding the interpreter lock throughout."""
    total = 0
    for i in range(COMPUTE_ITERATIONS):
        total += i * i % 7
    return total
