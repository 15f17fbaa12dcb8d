"""Identity and scope, submissions, and the idempotency boundary of a stable job id."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone as dj_timezone

from jobs import execution, store, validation
from jobs.api import JobScope, stage_job, submit_job
from jobs.exceptions import (
    InvalidJobId,
    InvalidPayload,
    InvalidScope,
    InvalidSubmission,
    JobIdentityConflict,
)
from jobs.models import Job, JobAttempt
from jobs.types import JobStatus, JobSubmission
from tests.support.factories import JobSubmissionFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2024, 3, 1, 12, 0, 0, tzinfo=UTC)


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TestScopeHash:
    @pytest.mark.parametrize("scope", ["tenant-42", "Owner", "owner", "mañana-😀", " padded "])
    def test_scope_hash_is_sha256_of_utf8(self, scope: str) -> None:
        snap = submit_job(scope, "job-1", JobSubmissionFactory())
        assert snap.scope_hash == sha256(scope)
        assert Job.objects.get().scope_hash == sha256(scope)
        assert JobScope(scope).scope_hash == sha256(scope)

    def test_case_makes_distinct_scopes_that_cannot_see_each_other(self) -> None:
        upper = submit_job("Owner", "job-1", JobSubmissionFactory(payload={"who": "Owner"}))
        lower = submit_job("owner", "job-1", JobSubmissionFactory(payload={"who": "owner"}))

        assert upper.created
        assert lower.created
        assert upper.scope_hash != lower.scope_hash
        assert Job.objects.count() == 2
        owner_upper = JobScope("Owner").get("job-1")
        owner_lower = JobScope("owner").get("job-1")
        assert owner_upper is not None
        assert owner_lower is not None
        assert owner_upper.payload == {"who": "Owner"}
        assert owner_lower.payload == {"who": "owner"}
        assert [j.payload for j in JobScope("Owner").list()] == [{"who": "Owner"}]
        assert JobScope("OWNER").get("job-1") is None

    @pytest.mark.parametrize("scope", ["\ud800", "tenant-\udfff", "a\ud83d"])
    def test_lone_surrogate_is_rejected_and_nothing_is_written(self, scope: str) -> None:
        with pytest.raises(InvalidScope, match="surrogate"):
            submit_job(scope, "job-1", JobSubmissionFactory())
        with pytest.raises(InvalidScope), transaction.atomic():
            stage_job(scope, "job-1", JobSubmissionFactory())
        with pytest.raises(InvalidScope):
            JobScope(scope)
        assert Job.objects.count() == 0

    def test_distinct_bad_scopes_are_not_folded_together(self) -> None:
        # Replacing surrogates would map both to "tenant-?" and share one scope.
        for scope in ("tenant-\ud800", "tenant-\ud801"):
            with pytest.raises(InvalidScope):
                JobScope(scope)

    @pytest.mark.parametrize("scope", ["", None, 42, b"tenant", "x" * 4097])
    def test_other_bad_scopes_are_rejected(self, scope: object) -> None:
        with pytest.raises(InvalidScope):
            submit_job(scope, "job-1", JobSubmissionFactory())  # type: ignore[arg-type]
        assert Job.objects.count() == 0


class TestJobId:
    @pytest.mark.parametrize(
        "job_id",
        [
            pytest.param("", id="empty"),
            pytest.param("x" * 201, id="201-chars"),
            pytest.param("a\nb", id="newline"),
            pytest.param("a\x00b", id="nul"),
            pytest.param("a\x7fb", id="del"),
            pytest.param("\tjob", id="tab"),
            pytest.param(" job", id="leading-space"),
            pytest.param("job ", id="trailing-space"),
            pytest.param("job-\ud800", id="lone-surrogate"),
            pytest.param(42, id="int"),
            pytest.param(b"job-1", id="bytes"),
        ],
    )
    def test_invalid_job_id_is_rejected_and_nothing_is_written(self, job_id: object) -> None:
        with pytest.raises(InvalidJobId):
            submit_job("tenant-42", job_id, JobSubmissionFactory())  # type: ignore[arg-type]
        with pytest.raises(InvalidJobId), transaction.atomic():
            stage_job("tenant-42", job_id, JobSubmissionFactory())  # type: ignore[arg-type]
        assert Job.objects.count() == 0

    def test_every_ascii_character_is_judged_as_the_text_rule_judges_it(self) -> None:
        # An ASCII job id takes a shorter path: it must accept exactly what the text
        # rule (no control character, NUL or surrogate) and the whitespace rule accept.
        def accepted(value: str) -> bool:
            try:
                validation.job_id(value)
            except InvalidJobId:
                return False
            return True

        for code in range(128):
            c = chr(code)
            for value in (f"a{c}b", f"{c}ab", f"ab{c}", c, "x" * 199 + c, "x" * 200 + c):
                expected = (
                    (code >= 0x20 and code != 0x7F)
                    and value == value.strip()
                    and len(value) <= validation.MAX_JOB_ID_LENGTH
                )
                assert accepted(value) is expected, repr(value)

    def test_longest_and_unusual_but_valid_job_ids_round_trip(self) -> None:
        ids = ["x" * 200, "résumé/2026 11", "Report", "report", "a:b.c-d_e", "日本語"]
        for job_id in ids:
            assert submit_job("tenant-42", job_id, JobSubmissionFactory()).created
        stored = set(Job.objects.values_list("job_id", flat=True))
        assert stored == set(ids)

    def test_job_id_case_matters(self) -> None:
        submit_job("tenant-42", "Report", JobSubmissionFactory(payload=1))
        snap = submit_job("tenant-42", "report", JobSubmissionFactory(payload=2))
        assert snap.created
        assert Job.objects.count() == 2

    def test_generated_job_ids_are_unique_hex(self) -> None:
        first = submit_job("tenant-42", None, JobSubmissionFactory())
        second = submit_job("tenant-42", None, JobSubmissionFactory())
        assert first.created
        assert second.created
        assert first.job_id != second.job_id
        for snap in (first, second):
            assert len(snap.job_id) == 32
            int(snap.job_id, 16)
        with transaction.atomic():
            staged = stage_job("tenant-42", None, JobSubmissionFactory())
        assert staged.job_id not in (first.job_id, second.job_id)
        assert Job.objects.count() == 3


class TestUniqueConstraints:
    def test_job_identity_is_unique_in_the_database(self, make_job) -> None:
        make_job.queued("job-1")
        row = make_job.row("job-1")
        row.pk = None
        with pytest.raises(IntegrityError), transaction.atomic():
            row.save(force_insert=True)
        assert Job.objects.count() == 1

    def test_attempt_identity_is_unique_in_the_database(self, make_job) -> None:
        claim = make_job.running("job-1")
        attempt = JobAttempt.objects.get(token=claim.token)
        attempt.pk = None
        attempt.token = "another-token"
        with pytest.raises(IntegrityError), transaction.atomic():
            attempt.save(force_insert=True)
        assert JobAttempt.objects.count() == 1

    def test_attempt_tokens_are_unique_in_the_database(self, make_job) -> None:
        claim = make_job.running("job-1")
        attempt = JobAttempt.objects.get(token=claim.token)
        attempt.pk = None
        attempt.number = 2
        with pytest.raises(IntegrityError), transaction.atomic():
            attempt.save(force_insert=True)


class TestSubmission:
    def test_submission_is_immutable(self) -> None:
        sub = JobSubmissionFactory()
        with pytest.raises(dataclasses.FrozenInstanceError):
            sub.payload_json = "{}"  # type: ignore[misc]
        with pytest.raises(dataclasses.FrozenInstanceError):
            sub.max_attempts = 5  # type: ignore[misc]

    def test_payload_is_serialised_at_create(self) -> None:
        payload = {"month": "2026-11", "ids": [1, 2], "ü": None}
        sub = JobSubmission.create("reports.generate", payload)
        payload["month"] = "changed"
        payload["ids"].append(3)  # type: ignore[attr-defined]
        assert sub.payload_json == '{"month":"2026-11","ids":[1,2],"ü":null}'
        assert sub.payload == {"month": "2026-11", "ids": [1, 2], "ü": None}

    def test_fields_are_kept(self) -> None:
        nb = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
        sub = JobSubmission.create(
            "reports.generate",
            [1],
            version=3,
            queue="reports",
            max_attempts=4,
            not_before=nb,
            priority=-7,
        )
        assert (sub.handler, sub.handler_version, sub.version) == ("reports.generate", 3, 3)
        assert (sub.queue, sub.max_attempts, sub.priority) == ("reports", 4, -7)
        assert sub.initial_not_before == nb
        assert sub.not_before == nb

    @pytest.mark.parametrize(
        "payload",
        [
            pytest.param(object(), id="object"),
            pytest.param(float("nan"), id="nan"),
            pytest.param(float("inf"), id="inf"),
            pytest.param({"a": [1.0, float("-inf")]}, id="nested-neg-inf"),
            pytest.param({1: 2}, id="int-key"),
            pytest.param({("a",): 2}, id="tuple-key"),
            pytest.param({1, 2}, id="set"),
            pytest.param({"a": {"b": {3}}}, id="nested-set"),
            pytest.param(b"bytes", id="bytes"),
            pytest.param(datetime(2026, 1, 1, tzinfo=UTC), id="datetime"),
            pytest.param({"k": "\ud800"}, id="surrogate-value"),
        ],
    )
    def test_non_json_payload_is_rejected(self, payload: object) -> None:
        with pytest.raises(InvalidPayload):
            JobSubmission.create("reports.generate", payload)

    @pytest.mark.parametrize(
        ("payload", "message"),
        [
            ({"a": [1, {"b": "\ud800"}]}, "payload['a'][1]['b'] contains a lone surrogate"),
            ({"ok": 1, "\udc00": 1}, "payload has a key with a lone surrogate"),
            (["x", ("y", "\ud800")], "payload[1][1] contains a lone surrogate"),
            ({"a": {"b": float("nan")}}, "payload['a']['b'] is nan"),
            ([1, {2: 3}], "payload[1] has a int key 2"),
            ({"a": [{"b": b"x"}]}, "payload['a'][0]['b'] is a bytes"),
        ],
    )
    def test_a_rejected_payload_names_where(self, payload: object, message: str) -> None:
        with pytest.raises(InvalidPayload) as raised:
            JobSubmission.create("reports.generate", payload)
        assert str(raised.value).startswith(message)

    def test_create_equals_the_constructor_of_the_same_fields(self) -> None:
        plus_two = timezone(timedelta(hours=2))
        nb = datetime(2030, 1, 1, 14, 0, 0, 5, tzinfo=plus_two)
        sub = JobSubmission.create(
            "reports.generate",
            {"a": 1},
            version=3,
            queue="q",
            max_attempts=4,
            not_before=nb,
            priority=-2,
        )
        built = JobSubmission(
            handler="reports.generate",
            handler_version=3,
            payload_json='{"a":1}',
            queue="q",
            priority=-2,
            max_attempts=4,
            initial_not_before=nb,
        )
        assert sub == built
        assert hash(sub) == hash(built)
        assert sub.initial_not_before is not None
        assert sub.initial_not_before.tzinfo is UTC
        with pytest.raises(dataclasses.FrozenInstanceError):
            sub.queue = "other"  # type: ignore[misc]

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("handler", "bad name"),
            ("version", 0),
            ("queue", ""),
            ("priority", True),
            ("max_attempts", 0),
            ("not_before", datetime(2030, 1, 1)),
        ],
    )
    def test_create_checks_every_field(self, field: str, value: object) -> None:
        arguments: dict[str, Any] = {"handler": "reports.generate", field: value}
        with pytest.raises(InvalidSubmission):
            JobSubmission.create(**arguments)

    def test_payload_text_is_what_json_dumps_writes(self) -> None:
        # A duplicate is recognised by the text byte for byte: a stored job's text must not change.
        payload = {
            "é€😀": ["ünï", 1.5, 1e300, -0.0, 2**70, True, None, {"": []}],
            "esc": 'a"b\\c\n\u0001',
            "n": -7,
        }
        for value in (payload, [payload, payload], "text", 3, 2.5, None, []):
            expected = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
            assert JobSubmission.create("reports.generate", value).payload_json == expected

    def test_the_payload_limit_counts_utf8_bytes_not_characters(self, settings) -> None:
        settings.JOBS = {**settings.JOBS, "MAX_PAYLOAD_BYTES": 100}
        assert JobSubmission.create("reports.generate", "é" * 49).payload == "é" * 49  # 100 bytes
        with pytest.raises(InvalidPayload, match="larger than 100 bytes"):
            JobSubmission.create("reports.generate", "é" * 50)  # 52 characters, 102 bytes
        with pytest.raises(InvalidPayload, match="larger than 100 bytes"):
            JobSubmission.create("reports.generate", "x" * 99)  # ASCII: 101 bytes

    def test_json_subtypes_serialise_as_json(self) -> None:
        class Label(str):
            pass

        class Level(enum.IntEnum):
            HIGH = 2

        sub = JobSubmission.create(
            "reports.generate", {"l": Label("x"), "n": Level.HIGH, "t": (1, 2.5, None, True)}
        )
        assert sub.payload_json == '{"l":"x","n":2,"t":[1,2.5,null,true]}'

    @pytest.mark.parametrize("text", ["NaN", "Infinity", "{bad", '{"a": -Infinity}', ""])
    def test_non_json_text_is_rejected(self, text: str) -> None:
        with pytest.raises(InvalidPayload):
            JobSubmission(handler="reports.generate", payload_json=text)

    def test_naive_datetime_is_rejected(self) -> None:
        with pytest.raises(InvalidSubmission, match="timezone-aware"):
            JobSubmission.create("reports.generate", not_before=datetime(2030, 1, 1))

    def test_aware_datetime_is_normalised_to_utc(self) -> None:
        plus_two = timezone(timedelta(hours=2))
        sub = JobSubmission.create(
            "reports.generate", not_before=datetime(2030, 1, 1, 14, 0, tzinfo=plus_two)
        )
        assert sub.initial_not_before == datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
        assert sub.initial_not_before.tzinfo is UTC  # type: ignore[union-attr]

    def test_json_text_is_compared_byte_for_byte(self) -> None:
        first = JobSubmission(handler="reports.generate", payload_json='{"a":1,"b":2}')
        second = JobSubmission(handler="reports.generate", payload_json='{"b":2,"a":1}')
        spaced = JobSubmission(handler="reports.generate", payload_json='{"a": 1, "b": 2}')
        submit_job("tenant-42", "job-1", first)

        for other in (second, spaced):
            with pytest.raises(JobIdentityConflict) as exc:
                submit_job("tenant-42", "job-1", other)
            assert exc.value.fields == ("payload_json",)
            assert "payload_json" in str(exc.value)
        assert Job.objects.get().payload_json == '{"a":1,"b":2}'

    def test_exact_json_text_is_stored(self) -> None:
        text = '{ "b" : 2 ,\n "a":[1, 2.50] }'
        submit_job("tenant-42", "job-1", JobSubmission(handler="h", payload_json=text))
        assert Job.objects.get().payload_json == text
        assert (
            submit_job("tenant-42", "job-1", JobSubmission(handler="h", payload_json=text)).created
            is False
        )

    @pytest.mark.parametrize(
        ("changes", "fields"),
        [
            ({"handler": "reports.other"}, ("handler",)),
            ({"version": 2}, ("handler_version",)),
            ({"payload": {"month": "2026-12"}}, ("payload_json",)),
            ({"queue": "slow"}, ("queue",)),
            ({"priority": 1}, ("priority",)),
            ({"max_attempts": 2}, ("max_attempts",)),
            ({"not_before": T0}, ("initial_not_before",)),
            (
                {"queue": "slow", "max_attempts": 3, "handler": "x.y"},
                ("handler", "queue", "max_attempts"),
            ),
        ],
    )
    def test_conflict_names_each_differing_field(
        self, changes: dict[str, object], fields: tuple[str, ...]
    ) -> None:
        original = submit_job("tenant-42", "job-1", JobSubmissionFactory())
        with pytest.raises(JobIdentityConflict) as exc:
            submit_job("tenant-42", "job-1", JobSubmissionFactory(**changes))
        assert exc.value.fields == fields
        assert exc.value.job_id == "job-1"
        for field in fields:
            assert field in str(exc.value)
        assert JobScope("tenant-42").get("job-1") == dataclasses.replace(
            original, created=False, attempts=()
        )

    def test_same_instant_in_another_timezone_is_the_same_request(self) -> None:
        submit_job("tenant-42", "job-1", JobSubmissionFactory(not_before=T0))
        same = T0.astimezone(timezone(timedelta(hours=-5)))
        assert not submit_job("tenant-42", "job-1", JobSubmissionFactory(not_before=same)).created

    @pytest.mark.parametrize("not_before", [None, T0])
    def test_initial_not_before_is_kept_while_next_run_at_moves(
        self, make_job, scope, not_before: datetime | None
    ) -> None:
        sub = JobSubmissionFactory(not_before=not_before, max_attempts=2)
        first = submit_job("tenant-42", "job-1", sub)
        assert first.initial_not_before == not_before
        if not_before is None:
            assert first.next_run_at == first.created_at
        else:
            assert first.next_run_at == not_before

        claim = execution.try_start(first.scope_hash, "job-1")
        assert claim is not None
        execution.fail(claim.token, "boom")
        later = dj_timezone.now() + timedelta(days=3)
        scope.retry("job-1", not_before=later)

        stored = make_job.get("job-1")
        assert stored.initial_not_before == not_before
        assert stored.next_run_at == later
        # The repeated identical request is recognised although the schedule moved.
        again = submit_job("tenant-42", "job-1", sub)
        assert again.created is False
        assert again.next_run_at == later

    def test_microseconds_round_trip(self, make_job) -> None:
        nb = datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC)
        make_job.queued("job-1", not_before=nb)
        row = make_job.row("job-1")
        assert row.initial_not_before == nb
        assert row.next_run_at == nb
        snap = make_job.get("job-1")
        assert snap.initial_not_before == nb
        assert snap.next_run_at == nb
        assert snap.next_run_at.utcoffset() == timedelta(0)

    def test_next_run_at_sorts_by_the_microsecond(self, make_job, submission_order) -> None:
        # Whole seconds are the edge case: on SQLite they are stored without a
        # fractional part and must still sort between their neighbours.
        times = [
            T0 - timedelta(microseconds=1),
            T0,
            T0 + timedelta(microseconds=1),
            T0 + timedelta(microseconds=10),
            T0 + timedelta(seconds=1) - timedelta(microseconds=1),
            T0 + timedelta(seconds=1),
            T0 + timedelta(seconds=1, microseconds=100000),
        ]
        shuffled = list(enumerate(times))
        random.Random(7).shuffle(shuffled)
        for index, when in shuffled:
            make_job.queued(f"job-{index}", not_before=when, payload=index)

        due = execution.get_due(limit=100)
        assert [d.job_id for d in due] == [f"job-{i}" for i in range(len(times))]
        assert [d.next_run_at for d in due] == times
        ordered = Job.objects.order_by("next_run_at").values_list("job_id", flat=True)
        assert list(ordered) == [f"job-{i}" for i in range(len(times))]
        # A bound in the middle splits them exactly.
        assert len(execution.get_due(limit=100, now=T0)) == 2
        assert len(store.get_due(limit=100, now=T0 + timedelta(microseconds=1))) == 3


class TestIdempotencyBoundary:
    def test_same_job_id_in_two_scopes_makes_two_jobs(self) -> None:
        a = submit_job("tenant-a", "invoice-17", JobSubmissionFactory())
        b = submit_job("tenant-b", "invoice-17", JobSubmissionFactory())
        assert a.created
        assert b.created
        assert Job.objects.count() == 2
        assert {j.status for j in Job.objects.all()} == {JobStatus.QUEUED}

    def test_a_different_request_in_another_scope_is_no_conflict(self) -> None:
        submit_job("tenant-a", "invoice-17", JobSubmissionFactory(payload=1))
        with transaction.atomic():
            b = stage_job("tenant-b", "invoice-17", JobSubmissionFactory(payload=2))
        assert b.created
        a_snap = JobScope("tenant-a").get("invoice-17")
        b_snap = JobScope("tenant-b").get("invoice-17")
        assert a_snap is not None
        assert b_snap is not None
        assert (a_snap.payload, b_snap.payload) == (1, 2)

    def test_each_scope_deduplicates_only_its_own(self) -> None:
        for scope in ("tenant-a", "tenant-b"):
            assert submit_job(scope, "invoice-17", JobSubmissionFactory()).created
            assert not submit_job(scope, "invoice-17", JobSubmissionFactory()).created
        assert Job.objects.count() == 2
