
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='WorkflowRun',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('scope_hash', models.CharField(max_length=64)),
                ('run_id', models.CharField(max_length=1000)),
                ('name', models.CharField(max_length=200)),
                ('version', models.PositiveIntegerField()),
                ('input_json', models.TextField()),
                ('output_json', models.TextField(blank=True, null=True)),
                ('status', models.CharField(choices=[('running', 'Running'), ('waiting', 'Waiting'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], default='waiting', max_length=16)),
                ('error', models.TextField(blank=True, default='')),
                ('failed_step', models.CharField(blank=True, default='', max_length=200)),
                ('waiting_for', models.CharField(blank=True, default='', max_length=500)),
                ('wake_at', models.DateTimeField(blank=True, null=True)),
                ('driver_token', models.CharField(blank=True, max_length=32, null=True)),
                ('driver_job', models.CharField(blank=True, max_length=200, null=True)),
                ('wake_pending', models.BooleanField(default=False)),
                ('generation', models.PositiveIntegerField(default=0)),
                ('advances', models.PositiveIntegerField(default=0)),
                ('cancel_requested', models.BooleanField(default=False)),
                ('parent_key', models.CharField(blank=True, default='', max_length=200)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('parent', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='children', to='workflows.workflowrun')),
            ],
            options={
                'verbose_name': 'workflow run',
            },
        ),
        migrations.CreateModel(
            name='WorkflowSignal',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=200)),
                ('payload_json', models.TextField()),
                ('created_at', models.DateTimeField()),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='signals', to='workflows.workflowrun')),
            ],
            options={
                'verbose_name': 'workflow signal',
            },
        ),
        migrations.CreateModel(
            name='WorkflowStep',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=200)),
                ('kind', models.CharField(choices=[('step', 'Inline step'), ('activity', 'Activity'), ('map', 'Map'), ('sleep', 'Timer'), ('signal', 'Signal'), ('child', 'Child run'), ('now', 'Clock')], max_length=16)),
                ('status', models.CharField(choices=[('running', 'Running'), ('waiting', 'Waiting'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], max_length=16)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('result_json', models.TextField(blank=True, null=True)),
                ('error_type', models.CharField(blank=True, default='', max_length=200)),
                ('error', models.TextField(blank=True, default='')),
                ('wake_at', models.DateTimeField(blank=True, null=True)),
                ('item_count', models.PositiveIntegerField(default=0)),
                ('started_at', models.DateTimeField()),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('child', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='workflows.workflowrun')),
                ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='workflows.workflowrun')),
            ],
            options={
                'verbose_name': 'workflow step',
            },
        ),
        migrations.CreateModel(
            name='WorkflowItem',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('index', models.PositiveIntegerField()),
                ('status', models.CharField(choices=[('running', 'Running'), ('waiting', 'Waiting'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled')], max_length=16)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('args_json', models.TextField()),
                ('result_json', models.TextField(blank=True, null=True)),
                ('error_type', models.CharField(blank=True, default='', max_length=200)),
                ('error', models.TextField(blank=True, default='')),
                ('job_id', models.CharField(max_length=200)),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('step', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='items', to='workflows.workflowstep')),
            ],
            options={
                'verbose_name': 'workflow map item',
            },
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(fields=['status', 'name', 'version'], name='workflows_run_status'),
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(fields=['status', 'finished_at'], name='workflows_run_finished'),
        ),
        migrations.AddIndex(
            model_name='workflowrun',
            index=models.Index(fields=['scope_hash', 'created_at'], name='workflows_run_scope'),
        ),
        migrations.AddConstraint(
            model_name='workflowrun',
            constraint=models.UniqueConstraint(fields=('scope_hash', 'run_id'), name='workflows_run_identity'),
        ),
        migrations.AddConstraint(
            model_name='workflowsignal',
            constraint=models.UniqueConstraint(fields=('run', 'key'), name='workflows_signal_identity'),
        ),
        migrations.AddConstraint(
            model_name='workflowstep',
            constraint=models.UniqueConstraint(fields=('run', 'key'), name='workflows_step_identity'),
        ),
        migrations.AddIndex(
            model_name='workflowitem',
            index=models.Index(condition=models.Q(('status', 'running')), fields=['step'], name='workflows_item_running'),
        ),
        migrations.AddConstraint(
            model_name='workflowitem',
            constraint=models.UniqueConstraint(fields=('step', 'index'), name='workflows_item_identity'),
        ),
    ]
