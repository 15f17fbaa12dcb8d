"""``python -m benchmarks --compare REV``: the burn-downs of this tree and of another
commit in one run, interleaved, with what each job cost the workers' Python (CPU time)
and the server (statements).

REV is checked out in a temporary ``git worktree``. Each tree gets a scratch database
of its own, migrated by its own ``manage.py`` (the schema may differ between them);
its workers, and the seeds that queue their jobs, run its own code in subprocesses.
The harness only reads and empties the job tables, over a connection of its own, the
same way for both trees.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from . import physical, server
from .harness import Runner, median_fields
from .systems import OURS, WorkerConfig
from .systems.base import QUEUE, ROOT
from .systems.ledon import HANDLERS, Ledon

#: The set-ups of ``--only burn-down`` with ``--compare``: (handler kind, set-up) — the
#: no-op at concurrency 4 and 16, the 5 ms handler at 16 and 64, and its ``async def``
#: form at 64 where both trees have it.
QUICK_SETUPS = (
    ("noop", WorkerConfig(1, 4)),
    ("noop", WorkerConfig(1, 16)),
    ("sleep5", WorkerConfig(1, 16)),
    ("sleep5", WorkerConfig(1, 64)),
    ("sleep5async", WorkerConfig(1, 64)),
)

#: What a tree runs to queue jobs at one commit (argv: count, id prefix, queue, handler).
_SEED = textwrap.dedent(
    """
    import sys, django
    django.setup()
    from jobs import JobSubmission, submit_jobs
    count, prefix, queue, handler = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    submit_jobs([
        ("bench", f"{prefix}{n}", JobSubmission.create(handler, {"n": n}, queue=queue))
        for n in range(count)
    ])
    """
)


@contextmanager
def checkout(rev: str) -> Iterator[tuple[Path, str]]:
    """REV checked out (detached) in a temporary worktree; yields its path and commit."""
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    path = Path(tempfile.mkdtemp(prefix="ledon-compare-")) / "tree"
    _git("worktree", "add", "--detach", str(path), commit)
    try:
        yield path, commit
    finally:
        _git("worktree", "remove", "--force", str(path))


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


class LedonTree(Ledon):
    """django-ledon as the tree at ``root`` has it, on its own database: its seeds and
    workers run its own code; the harness reads its tables over a connection of its own."""

    def __init__(self, database_url: str, root: Path, name: str) -> None:
        super().__init__(database_url)
        self.root, self.name = root, name
        self._conn: Any = None

    def version(self) -> str:
        return str(self.root)

    def worker_env(self) -> dict[str, str]:
        return {**super().worker_env(), "PYTHONPATH": str(self.root)}

    def _python(self, *args: str) -> None:
        subprocess.run(
            [sys.executable, *args], cwd=self.root, env=self.worker_env(), check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip

    def install(self) -> None:
        import psycopg

        self._python("manage.py", "migrate", "-v", "0")
        self._conn = psycopg.connect(self.database_url, autocommit=True)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def scalar(self, sql: str, *params: Any) -> Any:
        return self._conn.execute(sql, params).fetchone()[0]

    def analyze(self, admin: Callable[[str], None]) -> None:
        self._conn.execute("ANALYZE")

    def reset(self) -> None:
        # CASCADE: whatever references the jobs in this tree's schema goes too.
        self._conn.execute("TRUNCATE jobs_job CASCADE")

    def seed(self, count: int, kind: str = "noop") -> None:
        self._python("-c", _SEED, str(count), self._prefix(), QUEUE, HANDLERS[kind])

    def has_handler(self, kind: str) -> bool:
        """Whether this tree's benchmark handlers include ``kind``'s."""
        return f'"{HANDLERS[kind]}"' in (self.root / "benchmarks" / "tasks.py").read_text()

    def worker_command(self, concurrency: int, processes: int | None = None) -> list[str]:
        argv = super().worker_command(concurrency, processes)
        return [argv[0], str(self.root / "manage.py"), *argv[2:]]


def _key(kind: str, config: WorkerConfig) -> str:
    """A set-up's key: ``1p-c16``, ``1p-c64/sleep5async`` (as the per-job costs')."""
    return config.key + ("" if kind == "noop" else f"/{kind}")


def compare(
    rev: str,
    *,
    server_url: str,
    quick_setups: bool,
    plan: Any,
    out_dir: Path,
    log: Callable[[str], None],
    admin: Callable[[str], None],
    **_session: Any,
) -> dict[str, Any]:
    """The burn-downs of ``plan`` (``quick_setups``: :data:`QUICK_SETUPS` only) for this
    tree and for ``rev``, the trees alternating in each round; medians per set-up of
    jobs/s, the workers' CPU milliseconds per job and the statements per job."""
    wanted = list(QUICK_SETUPS if quick_setups else [("noop", c) for c in plan.configs])
    wanted = [(kind, config) for kind, config in wanted if plan.wants(kind, config, {})]
    count = plan.for_system(plan.burn_jobs, "django-ledon")
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        other_root, commit = stack.enter_context(checkout(rev))
        trees: list[LedonTree] = []
        for root, name in ((ROOT, "this tree"), (other_root, f"{rev} ({commit[:10]})")):
            url = stack.enter_context(
                server.scratch_database(server_url, f"ledon_compare_{len(trees)}")
            )
            tree = LedonTree(url, root, name)
            log(f"migrating {name}")
            tree.install()
            stack.callback(tree.close)
            trees.append(tree)
        setups = [(k, c) for k, c in wanted if all(tree.has_handler(k) for tree in trees)]
        runner = Runner(plan, list(trees), admin, log_dir, log, trees[0].database_url)
        runner.statements = all(physical.statements_available(t.database_url) for t in trees)
        for run in range(plan.runs):
            log(f"compare run {run + 1} of {plan.runs}")
            for kind, config in setups:
                jobs = count if kind == "noop" else plan.sleep_jobs_of(OURS)
                variant = "" if kind == "noop" else kind
                for tree in trees if run % 2 == 0 else trees[::-1]:
                    rate = runner.burn_down(tree, config, jobs, kind=kind, variant=variant)
                    runner.record(tree, _key(kind, config), rate)
    medians: dict[str, dict[str, dict[str, float | None]]] = {}
    for name, rates in runner.record.medians().items():
        costs = {key: median_fields(runs) for key, runs in runner.costs[name].items()}
        medians[name] = {
            key: {
                "jobs_per_s": rate,
                "cpu_ms_per_job": costs[key].get("worker_cpu_ms"),
                "cpu_total_ms_per_job": costs[key].get("worker_cpu_total_ms"),
                "statements": costs[key].get("statements"),
            }
            for key, rate in rates.items()
        }
    return {
        "rev": rev,
        "commit": commit,
        "jobs": count,
        "setups": [_key(k, c) for k, c in setups],
        "runs": runner.record.raw,
        "median": medians,
        "statements_measured": runner.statements,
    }
