"""A run's wait as data: its kind and the key of the checkpoint it waits at (until
when stays in ``wake_at``), instead of the display text ``waiting_for``.

The runs in flight are read from their text once, here (and written back as text if
the migration is reversed); nothing parses the text after this migration. The rules
are copied into this file, as a migration must keep working however the code moves.
"""

from datetime import UTC

from django.db import migrations, models

#: The texts of the waits without a key.
_FIXED = {"start": "start", "resume": "resume", "a new advance (the last one failed)": "advance"}
#: The prefixes of the waits whose key follows them.
_KEYED = (("signal ", "signal"), ("child ", "child"))


def _waiting_checkpoint(step_model, run_pk, kinds, status):
    """The key of the run's latest checkpoint of ``kinds`` standing at ``status``."""
    return (
        step_model.objects.filter(run_id=run_pk, kind__in=kinds, status=status)
        .order_by("-id")
        .values_list("key", flat=True)
        .first()
    )


def wait_from_text(apps, schema_editor):
    run_model = apps.get_model("workflows", "WorkflowRun")
    step_model = apps.get_model("workflows", "WorkflowStep")
    runs = run_model.objects.exclude(waiting_for="").values_list("pk", "waiting_for")
    for pk, text in runs.iterator():
        kind, key = "", ""
        if text in _FIXED:
            kind = _FIXED[text]
        elif text.startswith("timer until "):
            kind = "timer"
            key = _waiting_checkpoint(step_model, pk, ["sleep"], "waiting") or ""
        elif text.startswith("retry of ") and " at " in text:
            kind, key = "retry", text[len("retry of ") : text.rindex(" at ")]
        elif text.endswith(" items"):
            kind = "items"
            key = _waiting_checkpoint(step_model, pk, ["map", "activity"], "running") or ""
        else:
            for prefix, keyed in _KEYED:
                if text.startswith(prefix):
                    kind, key = keyed, text[len(prefix) :]
        run_model.objects.filter(pk=pk).update(wait_kind=kind, wait_key=key[:200])


def text_from_wait(apps, schema_editor):
    run_model = apps.get_model("workflows", "WorkflowRun")
    step_model = apps.get_model("workflows", "WorkflowStep")
    item_model = apps.get_model("workflows", "WorkflowItem")
    fixed = {kind: text for text, kind in _FIXED.items()}
    runs = run_model.objects.exclude(wait_kind="").values_list(
        "pk", "wait_kind", "wait_key", "wake_at"
    )
    for pk, kind, key, until in runs.iterator():
        at = until.astimezone(UTC).isoformat() if until is not None else "?"
        if kind in fixed:
            text = fixed[kind]
        elif kind == "timer":
            text = f"timer until {at}"
        elif kind == "retry":
            text = f"retry of {key} at {at}"
        elif kind == "items":
            total = (
                step_model.objects.filter(run_id=pk, key=key)
                .values_list("item_count", flat=True)
                .first()
            ) or 0
            running = item_model.objects.filter(
                step__run_id=pk, step__key=key, status="running"
            ).count()
            text = f"{total - running} of {total} items"
        else:
            text = f"{kind} {key}"
        run_model.objects.filter(pk=pk).update(waiting_for=text[:500])


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0002_run_rerun_keys"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="wait_kind",
            field=models.CharField(
                blank=True,
                choices=[
                    ("start", "start"),
                    ("resume", "resume"),
                    ("advance", "a new advance"),
                    ("signal", "signal"),
                    ("timer", "timer"),
                    ("items", "items"),
                    ("child", "child"),
                    ("retry", "retry"),
                ],
                default="",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="wait_key",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.RunPython(wait_from_text, text_from_wait, elidable=True),
        migrations.RemoveField(
            model_name="workflowrun",
            name="waiting_for",
        ),
    ]
