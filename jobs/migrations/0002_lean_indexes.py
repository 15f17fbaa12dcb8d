"""Fewer index writes per job: no lease index (running jobs are found through the
index of current tokens), no second index on the attempt token, none on the
attempt's job (the (job, number) index serves), finished history indexed only once
finished, and room in attempt pages so that finishing an attempt is a HOT update."""

import django.db.models.deletion
from django.db import migrations, models

#: PostgreSQL: each attempt row is written twice (started, then finished). Pages kept
#: 30 % free let the second write stay on the row's page without touching an index.
ATTEMPT_FILLFACTOR = 70


def attempt_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"ALTER TABLE jobs_jobattempt SET (fillfactor = {ATTEMPT_FILLFACTOR})"
        )


def default_fillfactor(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("ALTER TABLE jobs_jobattempt RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0001_initial"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="job",
            name="jobs_job_status_finished_idx",
        ),
        # Running jobs are found through the partial index of current tokens
        # (JobQuerySet.running); a claim then writes one index entry less, and a
        # heartbeat, which only moves the lease, can be a HOT update.
        migrations.RemoveIndex(
            model_name="job",
            name="jobs_job_running_lease_idx",
        ),
        migrations.AlterField(
            model_name="jobattempt",
            name="job",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="attempts",
                to="jobs.job",
            ),
        ),
        migrations.AlterField(
            model_name="jobattempt",
            name="token",
            field=models.CharField(max_length=64),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                models.F("finished_at"),
                condition=models.Q(("finished_at__isnull", False)),
                name="jobs_job_finished_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="jobattempt",
            constraint=models.UniqueConstraint(fields=("token",), name="jobs_attempt_token"),
        ),
        migrations.RunPython(attempt_fillfactor, default_fillfactor),
    ]
