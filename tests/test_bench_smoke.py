"""The benchmark harness runs (``--quick``) and writes well-formed results.

Nothing here asserts a speed: performance is read from ``make bench``, never from tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from benchmarks import report

ROOT = Path(__file__).resolve().parents[1]


def server_url() -> str:
    """The test database's server, as a URL to its maintenance database."""
    s = connection.settings_dict
    user = quote(s["USER"] or "")
    password = f":{quote(s['PASSWORD'])}" if s["PASSWORD"] else ""
    host = s["HOST"] or "127.0.0.1"
    port = f":{s['PORT']}" if s["PORT"] else ""
    return f"postgres://{user}{password}@{host}{port}/postgres"


@pytest.mark.slow
@pytest.mark.postgres_only
def test_quick_run_writes_results_and_a_report(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--systems",
            "django-ledon",
            "--database-url",
            server_url(),
            "--out",
            str(tmp_path),
            "--docs",
            str(docs),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document = json.loads((tmp_path / "latest.json").read_text())
    ours = document["systems"]["django-ledon"]
    for key in ("enqueue_each", "enqueue_bulk", "burn_1p-c4"):
        assert ours[key]["median"] > 0
        assert len(ours[key]["runs"]) == 1
    assert ours["latency"]["samples"] == len(ours["latency"]["values_ms"]) > 0
    assert document["claim_cost"]["loaded"]["claim_1_ms"] > 0
    flow = document["flow_control"]
    assert set(flow["median"]) == {"off", "max_running", "all_three"}
    assert all(rate > 0 for rate in flow["median"].values())
    assert set(flow["slowdown"]) == {"max_running", "all_three"}
    assert document["environment"]["postgresql"]["server_version"]
    markdown = docs.read_text()
    assert "# Benchmarks" in markdown
    assert document["outbox"]["median"] > 0
    assert document["sagas"]["ms_per_step"] > 0
    assert "| Enqueue, bulk API |" in markdown
    assert "## Targets" in markdown
    assert "| max_running=64 |" in markdown
    assert "Burn-down with limits ≤ 1.3× slower than without" in markdown


def synthetic(peer_factor: float) -> dict:
    """A results document as a full run writes it, with made-up numbers."""

    def measured(value: float) -> dict:
        return {"jobs": 100, "runs": [value], "median": value}

    def system(scale: float, *, bulk: bool = True) -> dict:
        entry = {
            "version": "1",
            "enqueue_each": measured(1000 * scale),
            "burn_1p-c4": measured(2000 * scale),
            "burn_configs": {"1p-c4": "1p-c4"},
            "latency": {"samples": 2, "p50_ms": 2 / scale, "p99_ms": 4 / scale},
        }
        if bulk:
            entry["enqueue_bulk"] = measured(30000 * scale)
        return entry

    pgqueuer = system(peer_factor)
    pgqueuer["burn_configs"] = {"1p-c4": "1p-c0"}
    pgqueuer["burn_1p-c0"] = pgqueuer.pop("burn_1p-c4")
    return {
        "environment": {
            "date": "2026-01-01T00:00:00+00:00",
            "python": "3.13",
            "platform": "test",
            "cpus": 2,
            "postgresql": {"server_version": "15", "fsync": "on"},
        },
        "plan": {"runs": 1, "bulk_jobs": 100, "configs": [{"processes": 1, "concurrency": 4}]},
        "systems": {"django-ledon": system(1.0), "pgqueuer": pgqueuer},
        "claim_cost": {
            "finished_rows": 10,
            "empty": {"claim_1_ms": 1.0, "claim_16_ms": 2.0},
            "loaded": {"claim_1_ms": 1.1, "claim_16_ms": 2.0},
            "ratio_claim_1": 1.1,
            "ratio_claim_16": 1.0,
        },
    }


def test_report_renders_ratios_and_target_verdicts() -> None:
    markdown = report.render(synthetic(peer_factor=0.5))
    assert "| Burn-down, 1 worker process, concurrency 4 | 2,000 | 1,000 ‡ | 2.0× |" in markdown
    verdicts = {t: holds for t, _, holds in report.targets(synthetic(0.5))}
    assert verdicts["Burn-down ≥ 1.5× pgqueuer at equal resources (every set-up)"] is True
    assert verdicts["Bulk submit ≥ 20,000 jobs/s"] is True
    slower = {t: holds for t, _, holds in report.targets(synthetic(1.0))}
    assert slower["Burn-down ≥ 1.5× pgqueuer at equal resources (every set-up)"] is False
