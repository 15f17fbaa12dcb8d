"""Every statement the jobs store's builders render (and those the outbox store
builds as text), per variant, kept as readable SQL in ``tests/jobs/golden_sql/`` — a
change to the store's SQL shows in review as a change to these files. Rendering needs
no database server: the builders' text depends only on the vendor and their
arguments.

After an intended change, regenerate the files and review the diff::

    LEDON_UPDATE_GOLDEN=1 python -m pytest tests/jobs/test_golden_sql.py
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlparse
from sqlparse.engine import grouping

from jobs.store import sql, sql_endings, sql_flow, sql_limits, sql_submit
from outbox import store as outbox_store

GOLDEN = Path(__file__).parent / "golden_sql"
UPDATE = os.environ.get("LEDON_UPDATE_GOLDEN") == "1"
VENDORS = ("postgresql", "sqlite")


def _variants() -> dict[str, Callable[[], str]]:
    """Each variant's file name (without ``.sql``) and how to render it."""
    out: dict[str, Callable[[], str]] = {}

    def add(name: str, render: Callable[[], str]) -> None:
        assert name not in out, name
        out[name] = render

    # Claims without limits. On PostgreSQL the claim may also finish a batch; on
    # SQLite it may take jobs chosen under limits by id.
    for queues, one_job in itertools.product((0, 2), (False, True)):
        shape = f"queues{queues}{'-one_job' if one_job else ''}"
        for finishing in (False, True):
            add(
                f"claim-postgresql-{shape}{'-finishing' if finishing else ''}",
                lambda q=queues, o=one_job, f=finishing: sql.claim(
                    "postgresql", queues=q, one_job=o, finishing=f
                ),
            )
        for chosen in (0, 2):
            add(
                f"claim-sqlite-{shape}{f'-chosen{chosen}' if chosen else ''}",
                lambda q=queues, o=one_job, c=chosen: sql.claim(
                    "sqlite", queues=q, one_job=o, chosen=c
                ),
            )
            # Under limits: the jobs' limit keys and costs come back too.
            add(
                f"claim-sqlite-{shape}{f'-chosen{chosen}' if chosen else ''}-limited",
                lambda q=queues, o=one_job, c=chosen: sql.claim(
                    "sqlite", queues=q, one_job=o, chosen=c, limited=True
                ),
            )
    for rows in (1, 3):
        add(f"insert_attempts-sqlite-rows{rows}", lambda r=rows: sql.insert_attempts(r))

    # Finishing: one rule, every guard.
    for lease_guard, owner_guard in itertools.product((False, True), repeat=2):
        guards = "".join(
            f"-{name}" for name, on in (("lease", lease_guard), ("owner", owner_guard)) if on
        )
        add(
            f"finish-postgresql{guards}",
            lambda lg=lease_guard, og=owner_guard: sql.finish(lease_guard=lg, owner_guard=og),
        )
        for rows in (1, 3):
            add(
                f"finish_attempts_sqlite-rows{rows}{guards}",
                lambda r=rows, lg=lease_guard, og=owner_guard: sql.finish_attempts_sqlite(
                    r, lease_guard=lg, owner_guard=og
                ),
            )
            add(
                f"finish_jobs_sqlite-rows{rows}{guards}",
                lambda r=rows, lg=lease_guard, og=owner_guard: sql.finish_jobs_sqlite(
                    r, lease_guard=lg, owner_guard=og
                ),
            )

    # Progress, leases, retention, wake-ups.
    add("report_progress", lambda: sql.REPORT_PROGRESS)
    for tokens in (1, 3):
        add(f"renew_leases-tokens{tokens}", lambda t=tokens: sql.renew_leases(t))
    add("notify-postgresql", lambda: sql.NOTIFY)
    add("commit-postgresql", lambda: sql_limits.COMMIT)
    for vendor in VENDORS:
        add(f"purge_finished-{vendor}", lambda v=vendor: sql.purge_finished(v))
    for jobs in (1, 3):
        add(f"delete_attempts-sqlite-jobs{jobs}", lambda j=jobs: sql.delete_attempts(j))

    # Submission.
    for rows, notify in ((1, False), (1, True), (3, False)):
        add(
            f"insert_jobs-rows{rows}{'-notify-postgresql' if notify else ''}",
            lambda r=rows, n=notify: sql_submit.insert_jobs(r, notify=n),
        )
    add(
        "insert_jobs-rows1-lane-postgresql",
        lambda: sql_submit.insert_jobs(1, lane=True),
    )
    add(
        "insert_jobs-rows1-notify-lane-postgresql",
        lambda: sql_submit.insert_jobs(1, notify=True, lane=True),
    )
    for vendor in VENDORS:
        add(f"reserve_lane-{vendor}", lambda v=vendor: sql_submit.reserve_lane(v))
        add(
            f"reserve_lane-{vendor}-new_job",
            lambda v=vendor: sql_submit.reserve_lane(v, new_job=True),
        )
    add("insert_jobs-rows1-unique", lambda: sql_submit.insert_jobs(1, unique=True))
    add(
        "insert_jobs-rows1-notify-lane-unique-postgresql",
        lambda: sql_submit.insert_jobs(1, notify=True, lane=True, unique=True),
    )
    add("take_hold", lambda: sql_submit.TAKE_HOLD)
    for vendor in VENDORS:
        add(f"debounce_job-{vendor}", lambda v=vendor: sql_submit.debounce_job(v))
    add("insert_jobs_json-postgresql", lambda: sql_submit.INSERT_JOBS_JSON)
    add("insert_new_jobs_json-postgresql", lambda: sql_submit.INSERT_NEW_JOBS_JSON)

    # Queues, snoozes, releases, put-backs.
    add("pause_queue", lambda: sql_flow.PAUSE_QUEUE)
    add("resume_queue", lambda: sql_flow.RESUME_QUEUE)
    add("snooze_job", lambda: sql_flow.SNOOZE_JOB)
    add("snooze_refused", lambda: sql_flow.SNOOZE_REFUSED)
    add("snooze_attempt", lambda: sql_flow.SNOOZE_ATTEMPT)
    add("release_job", lambda: sql_flow.RELEASE_JOB)
    add("release_attempt", lambda: sql_flow.RELEASE_ATTEMPT)
    add("put_back_unknown_handler", lambda: sql_flow.PUT_BACK_UNKNOWN_HANDLER)
    for vendor in VENDORS:
        add(f"expire_jobs-{vendor}", lambda v=vendor: sql_flow.expire_jobs(v))

    # Recovery under the crash budget, with each of its guards.
    for lease_guard, owner_guard in itertools.product((False, True), repeat=2):
        guards = "".join(
            f"-{name}" for name, on in (("lease", lease_guard), ("owner", owner_guard)) if on
        )
        add(
            f"recover_job{guards}",
            lambda lg=lease_guard, og=owner_guard: sql_flow.recover_job(
                lease_guard=lg, owner_guard=og
            ),
        )
    add("recover_attempt", lambda: sql_flow.RECOVER_ATTEMPT)

    _limit_variants(add)
    _ending_variants(add)

    # The outbox store's statements built as text (the rest are the ORM's).
    add("outbox-insert", lambda: outbox_store.insert_sql(keyed=False, vendor="postgresql"))
    for vendor in VENDORS:
        add(
            f"outbox-insert-keyed-{vendor}",
            lambda v=vendor: outbox_store.insert_sql(keyed=True, vendor=v),
        )
    add("outbox-follow", outbox_store.follow_sql)
    add("outbox-lock_key-postgresql", lambda: outbox_store.LOCK_KEY)
    add("outbox-lock_key_and_notify-postgresql", lambda: outbox_store.LOCK_KEY_AND_NOTIFY)
    for messages in (1, 3):
        add(f"outbox-sent-messages{messages}", lambda m=messages: outbox_store.sent_sql(m))
    for vendor, keys in itertools.product(VENDORS, (1, 3)):
        add(
            f"outbox-release-{vendor}-keys{keys}",
            lambda v=vendor, k=keys: outbox_store.release_sql(v, k),
        )
    for vendor in VENDORS:
        add(f"outbox-claim-{vendor}", lambda v=vendor: outbox_store.claim_sql(v))
        for name, guard in zip(
            ("expired", "dispatcher"), outbox_store.RECOVERY_GUARDS, strict=True
        ):
            add(
                f"outbox-recover-{vendor}-{name}",
                lambda v=vendor, g=guard: outbox_store.recover_sql(v, g),
            )
    return out


def _ending_variants(add: Callable[[str, Callable[[], str]], None]) -> None:
    """What follows a job's move into, out of or between final states: batches and
    sequences (every other statement that moves jobs wraps itself in
    :func:`sql_endings.with_endings` on PostgreSQL)."""
    for name, statement, was in (
        ("expire_jobs", sql_flow.expire_jobs("postgresql"), "'queued'"),
        ("put_back_unknown_handler", sql_flow.PUT_BACK_UNKNOWN_HANDLER, "'running'"),
        ("cancel_queued", sql_endings.CANCEL_QUEUED, "'queued'"),
        ("cancel_failed", sql_endings.CANCEL_FAILED, "'failed'"),
    ):
        add(
            f"with_endings-postgresql-{name}",
            lambda s=statement, w=was: sql_endings.with_endings(s, w),
        )
    add("cancel_queued", lambda: sql_endings.CANCEL_QUEUED)
    add("cancel_failed", lambda: sql_endings.CANCEL_FAILED)
    add("release-postgresql", lambda: sql_endings.RELEASE)
    add("halt-sqlite", lambda: sql_endings.HALT_SQLITE)
    add("unhalt", lambda: sql_endings.UNHALT)
    add("hold_one", lambda: sql_endings.HOLD_ONE)
    add("release_one", lambda: sql_endings.RELEASE_ONE)
    add("release_new-sqlite", lambda: sql_endings.RELEASE_NEW)
    add("admit", lambda: sql_endings.ADMIT)
    add("admit_many-postgresql", lambda: sql_endings.ADMIT_MANY)
    add("insert_batch", lambda: sql_endings.INSERT_BATCH)
    for rows in (1, 3):
        add(f"release-sqlite-rows{rows}", lambda r=rows: sql_endings.release_sqlite(r))
        add(f"batch_moves-rows{rows}", lambda r=rows: sql_endings.batch_moves_sqlite(r))
        add(f"sequence_moves-rows{rows}", lambda r=rows: sql_endings.sequence_moves_sqlite(r))
        add(f"insert_thens-rows{rows}", lambda r=rows: sql_endings.insert_thens_sqlite(r))
        add(f"cancel_queued_ids-rows{rows}", lambda r=rows: sql_endings.cancel_queued_ids(r))
    add("insert_jobs-rows1-member", lambda: sql_submit.insert_jobs(1, member=True))
    add("insert_jobs-rows3-member", lambda: sql_submit.insert_jobs(3, member=True))
    add(
        "insert_jobs-rows1-notify-lane-unique-member-postgresql",
        lambda: sql_submit.insert_jobs(1, notify=True, lane=True, unique=True, member=True),
    )
    add(
        "insert_jobs_json-member-postgresql",
        lambda: sql_submit.insert_jobs_json(member=True),
    )
    add(
        "insert_new_jobs_json-member-postgresql",
        lambda: sql_submit.insert_new_jobs_json(member=True),
    )


def _limit_variants(add: Callable[[str, Callable[[], str]], None]) -> None:
    """Claims under limits: each limit alone, all of them, on a handler and a queue;
    each rate as a window and as a bucket."""
    shape = sql_limits.KeyShape
    shapes: dict[str, tuple[sql_limits.KeyShape, ...]] = {
        "max_running": (shape("h", max_running=True),),
        "per_scope": (shape("q", per_scope=True),),
        "per_key": (shape("h", per_key=True),),
        "rate_window": (shape("h", rate="window"),),
        "rate_bucket": (shape("q", rate="bucket"),),
        "rate_per_key_window": (shape("q", rate_per_key="window"),),
        "rate_per_key_bucket": (shape("h", rate_per_key="bucket"),),
        "all": (
            shape("h", True, True, True, "bucket", "window"),
            shape("q", True, True, True, "window", "bucket"),
        ),
    }
    for name, keys in shapes.items():
        for builder in ("counted_claim", "limited_claim"):
            for finishing in (False, True):
                add(
                    f"{builder}-postgresql-{name}{'-finishing' if finishing else ''}",
                    lambda b=builder, k=keys, f=finishing: getattr(sql_limits, b)(
                        queues=0, one_job=False, finishing=f, keys=k
                    ),
                )
    for builder in ("counted_claim", "limited_claim"):
        add(
            f"{builder}-postgresql-all-queues2-one_job",
            lambda b=builder: getattr(sql_limits, b)(
                queues=2, one_job=True, finishing=False, keys=shapes["all"]
            ),
        )
    add("lock_keys-postgresql", lambda: sql_limits.LOCK_KEYS)
    add("give_back-postgresql", lambda: sql.GIVE_BACK)
    add("usage-sqlite-handlers1", lambda: sql_limits.usage(1, 0))
    add("usage-sqlite-all", lambda: sql_limits.usage(1, 1))
    add("candidates-sqlite", lambda: sql_limits.candidates(queues=0, one_job=False))
    add(
        "candidates-sqlite-all",
        lambda: sql_limits.candidates(
            queues=2,
            one_job=True,
            full_handlers=1,
            full_queues=1,
            full_handler_scopes=1,
            full_queue_scopes=1,
            full_handler_keys=1,
            full_queue_keys=1,
            seen=2,
        ),
    )
    for rows in (1, 3):
        add(f"read_rates-sqlite-keys{rows}", lambda r=rows: sql_limits.read_rates(r))
        add(f"write_rates-sqlite-rows{rows}", lambda r=rows: sql_limits.write_rates(r))
    add("prune_rates", lambda: sql_limits.PRUNE_RATES)


VARIANTS = _variants()


def render(statement: str) -> str:
    """A statement as its golden file holds it: one clause a line. The store's
    statements are trusted text: the longest (a claim under every limit that also
    finishes, with what follows in batches and sequences) has more tokens than
    sqlparse's guard against hostile input lets through, lifted here while it renders."""
    guard = grouping.MAX_GROUPING_TOKENS
    grouping.MAX_GROUPING_TOKENS = None
    try:
        return sqlparse.format(statement, reindent=True, indent_width=2).strip() + "\n"
    finally:
        grouping.MAX_GROUPING_TOKENS = guard


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_rendered_statement_matches_its_golden_file(name):
    path = GOLDEN / f"{name}.sql"
    rendered = render(VARIANTS[name]())
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(rendered)
    assert path.exists(), f"{path} is missing: run with LEDON_UPDATE_GOLDEN=1 to write it"
    assert rendered == path.read_text(), (
        f"the statement differs from {path}: if the change is intended, run "
        "LEDON_UPDATE_GOLDEN=1 python -m pytest tests/jobs/test_golden_sql.py and review the diff"
    )


def _builders() -> set[str]:
    """The store's statements: each cached builder and each constant statement, named
    as a variant's file name starts."""
    names = set()
    for module in (sql, sql_flow, sql_limits, sql_submit):
        for name, value in vars(module).items():
            statement = isinstance(value, str) and re.match(
                r"(SELECT|UPDATE|INSERT|DELETE|WITH|COMMIT)\b", value
            )
            if not name.startswith("_") and (statement or hasattr(value, "cache_info")):
                names.add(name.lower())
    return names


def test_every_statement_of_the_store_has_a_golden_variant():
    covered = {name.split("-")[0] for name in VARIANTS if not name.startswith("outbox-")}
    assert _builders() - covered == set()


def test_every_golden_file_is_a_statement_the_store_renders():
    stale = sorted(path.stem for path in GOLDEN.glob("*.sql") if path.stem not in VARIANTS)
    if UPDATE:
        for name in stale:
            (GOLDEN / f"{name}.sql").unlink()
        stale = []
    assert not stale, f"golden files of no variant (LEDON_UPDATE_GOLDEN=1 removes them): {stale}"
