"""A checkpoint kind for patch markers (``wf.patched``): a choices change only."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("workflows", "0004_run_deadline"),
    ]

    operations = [
        migrations.AlterField(
            model_name="workflowstep",
            name="kind",
            field=models.CharField(
                choices=[
                    ("step", "Inline step"),
                    ("activity", "Activity"),
                    ("map", "Map"),
                    ("sleep", "Timer"),
                    ("signal", "Signal"),
                    ("child", "Child run"),
                    ("now", "Clock"),
                    ("patch", "Patch"),
                ],
                max_length=16,
            ),
        ),
    ]
