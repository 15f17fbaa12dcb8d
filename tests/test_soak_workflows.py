"""The workflows part of the soak judges its advance latencies against its targets:
p99 while the vacuum horizon is pinned within 3x of before, and within 1.5x in the
minute after (``benchmarks.soak_workflows``). Nothing here measures a speed."""

from __future__ import annotations

from benchmarks.soak_workflows import per_minute, verdicts

START = 1_000.0
#: The pin from the fourth minute to the end of the sixth, as a 9-minute soak holds it.
HELD = (180.0, 360.0)


def advances(latency_by_minute: dict[int, float]) -> list[tuple[float, float, str]]:
    """Ten advances due in each given minute, each late by that minute's latency."""
    return [
        (START + 60 * minute + 6 * n, late, "timer" if n % 2 else "signal")
        for minute, late in latency_by_minute.items()
        for n in range(10)
    ]


def test_a_pin_within_its_targets_passes_both_verdicts():
    found = verdicts(advances({1: 0.1, 2: 0.1, 3: 0.25, 4: 0.3, 5: 0.2, 6: 0.12}), START, HELD)
    assert (found["p99_before_ms"], found["p99_pinned_ms"], found["p99_minute_after_ms"]) == (
        100.0,
        300.0,
        120.0,
    )
    assert (found["pinned_ratio"], found["after_ratio"]) == (3.0, 1.2)
    assert found["pinned_ok"] is True
    assert found["back_within_a_minute"] is True


def test_a_pin_beyond_its_targets_fails_each_verdict():
    found = verdicts(advances({1: 0.1, 2: 0.1, 3: 0.2, 4: 0.31, 6: 0.16}), START, HELD)
    assert found["pinned_ok"] is False
    assert found["back_within_a_minute"] is False


def test_the_first_minute_is_left_out_of_before_and_a_missing_phase_is_not_judged():
    # The first minute warms up: its slow advances are no part of "before".
    found = verdicts(advances({0: 5.0, 1: 0.1, 2: 0.1, 3: 0.2}), START, HELD)
    assert found["p99_before_ms"] == 100.0
    assert found["pinned_ok"] is True
    assert found["p99_minute_after_ms"] is None
    assert found["back_within_a_minute"] is None


def test_per_minute_counts_each_minutes_advances():
    rows = per_minute(advances({0: 0.05, 2: 0.2}), START, 2.5)
    assert [row["advances"] for row in rows] == [10, 0, 10]
    assert [row["advance_p99_ms"] for row in rows] == [50.0, None, 200.0]
