from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrun',
            name='rerun_keys',
            field=models.JSONField(blank=True, default=list),
        ),
    ]
