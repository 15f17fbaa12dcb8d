"""A run's tags: the caller's business keys, kept as a JSON object on the run.

On PostgreSQL they are indexed for the containment operator (``tags @> '{...}'``,
what a search by tags asks): a GIN index of ``jsonb_path_ops``, small and made for
exactly that operator. SQLite has no such index; its searches read the rows the other
conditions leave.
"""

from django.db import migrations, models

INDEX = "workflows_run_tags"


def index_tags(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX {INDEX} ON workflows_workflowrun USING gin (tags jsonb_path_ops)"
        )


def drop_tags_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):

    dependencies = [
        ("workflows", "0005_step_kind_patch"),
    ]

    operations = [
        migrations.AddField(
            model_name="workflowrun",
            name="tags",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(index_tags, drop_tags_index),
    ]
