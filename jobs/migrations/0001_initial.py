import django.db.models.deletion
from django.db import migrations, models


#: PostgreSQL: each attempt row is written twice (started, then finished). Pages kept
#: 30 % free let the second write stay on the row's page without touching an index
#: (a HOT update).
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

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='Queue',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('paused', models.BooleanField(default=False)),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='ClaimStart',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=320)),
                ('started_at', models.DateTimeField()),
            ],
            options={
                'indexes': [models.Index(models.F('key'), models.F('started_at'), name='jobs_claimstart_key_idx')],
            },
        ),
        migrations.CreateModel(
            name='Job',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('scope_hash', models.CharField(max_length=64)),
                ('job_id', models.CharField(max_length=200)),
                ('handler', models.CharField(max_length=200)),
                ('handler_version', models.PositiveIntegerField()),
                ('payload_json', models.TextField()),
                ('queue', models.CharField(default='default', max_length=100)),
                ('priority', models.SmallIntegerField(default=0)),
                ('max_attempts', models.PositiveIntegerField(default=1)),
                ('initial_not_before', models.DateTimeField(blank=True, null=True)),
                ('next_run_at', models.DateTimeField()),
                ('status', models.CharField(choices=[('queued', 'Queued'), ('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('interrupted', 'Interrupted')], default='queued', max_length=16)),
                ('attempt_count', models.PositiveIntegerField(default=0)),
                ('current_token', models.CharField(blank=True, max_length=64, null=True)),
                ('cancel_requested', models.BooleanField(default=False)),
                ('progress', models.FloatField(blank=True, null=True)),
                ('progress_message', models.TextField(blank=True, default='')),
                ('error', models.TextField(blank=True, default='')),
                ('result_ref', models.TextField(blank=True, null=True)),
                ('leased_by', models.CharField(blank=True, default='', max_length=200)),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('started_at', models.DateTimeField(blank=True, null=True)),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('handler_unknown_since', models.DateTimeField(blank=True, help_text='First claimed by a worker without its handler.', null=True)),
                ('snooze_count', models.PositiveIntegerField(db_default=0, default=0, help_text='Executions that snoozed (not counted as attempts).')),
                ('release_count', models.PositiveIntegerField(db_default=0, default=0, help_text="Claims given back unused at a worker's shutdown (not counted as attempts).")),
                ('granted_attempts', models.PositiveIntegerField(db_default=0, default=0, help_text='Attempts granted by retries beyond the max_attempts submitted.')),
                ('trace_context', models.TextField(blank=True, help_text="The submitter's trace context (W3C headers, JSON).", null=True)),
                ('limit_keys', models.TextField(blank=True, help_text='The limit counters its execution counts in.', null=True)),
            ],
            options={
                'ordering': ['created_at', 'id'],
                'indexes': [models.Index(models.OrderBy(models.F('priority'), descending=True), models.F('next_run_at'), models.F('id'), condition=models.Q(('cancel_requested', False), ('status', 'queued')), name='jobs_job_due_idx'), models.Index(models.F('scope_hash'), models.F('created_at'), name='jobs_job_scope_created_idx'), models.Index(models.F('finished_at'), condition=models.Q(('finished_at__isnull', False)), name='jobs_job_finished_idx')],
                'constraints': [models.UniqueConstraint(fields=('scope_hash', 'job_id'), name='jobs_job_identity'), models.UniqueConstraint(condition=models.Q(('current_token__isnull', False)), fields=('current_token',), name='jobs_job_current_token'), models.CheckConstraint(condition=models.Q(('status__in', ['queued', 'running', 'succeeded', 'failed', 'cancelled', 'interrupted'])), name='jobs_job_status_valid'), models.CheckConstraint(condition=models.Q(('attempt_count__lte', models.F('max_attempts'))), name='jobs_job_attempts_within_max')],
            },
        ),
        migrations.CreateModel(
            name='LimitCounter',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=400, unique=True)),
                ('running', models.BigIntegerField(default=0)),
                ('cap', models.BigIntegerField(blank=True, null=True)),
            ],
            options={
                'constraints': [models.CheckConstraint(condition=models.Q(('cap__isnull', True), ('running__lte', models.F('cap')), _connector='OR'), name='jobs_limitcounter_within_cap')],
            },
        ),
        migrations.CreateModel(
            name='Schedule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100)),
                ('cron', models.CharField(blank=True, default='', max_length=200)),
                ('every_seconds', models.PositiveIntegerField(default=0)),
                ('timezone', models.CharField(default='UTC', max_length=64)),
                ('catch_up', models.CharField(choices=[('latest', 'Latest'), ('all', 'All'), ('skip', 'Skip')], default='latest', max_length=8)),
                ('handler', models.CharField(max_length=200)),
                ('handler_version', models.PositiveIntegerField(default=1)),
                ('queue', models.CharField(default='default', max_length=100)),
                ('next_run_at', models.DateTimeField()),
                ('last_period', models.DateTimeField(blank=True, null=True)),
                ('last_job_id', models.CharField(blank=True, default='', max_length=200)),
                ('last_enqueued_at', models.DateTimeField(blank=True, null=True)),
                ('paused', models.BooleanField(default=False)),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'db_table': 'jobs_schedule',
                'ordering': ['name'],
                'constraints': [models.UniqueConstraint(fields=('name',), name='jobs_schedule_name'), models.CheckConstraint(condition=models.Q(models.Q(('cron', ''), ('every_seconds__gt', 0)), models.Q(models.Q(('cron', ''), _negated=True), ('every_seconds', 0)), _connector='OR'), name='jobs_schedule_cron_xor_every')],
            },
        ),
        migrations.CreateModel(
            name='WorkerRecord',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('kind', models.CharField(max_length=50)),
                ('engine_id', models.CharField(max_length=300, verbose_name='id')),
                ('token', models.CharField(max_length=64)),
                ('host', models.CharField(max_length=255)),
                ('pid', models.PositiveIntegerField()),
                ('queues', models.JSONField(blank=True, default=list)),
                ('concurrency', models.PositiveIntegerField(default=1)),
                ('version', models.CharField(blank=True, default='', max_length=50)),
                ('running', models.PositiveIntegerField(default=0, help_text='Work held at the last heartbeat.')),
                ('started_at', models.DateTimeField()),
                ('last_heartbeat_at', models.DateTimeField()),
                ('unhealthy_since', models.DateTimeField(blank=True, null=True)),
                ('unhealthy_reason', models.CharField(blank=True, default='', max_length=300)),
            ],
            options={
                'verbose_name': 'worker',
                'ordering': ['kind', 'engine_id'],
                'indexes': [models.Index(fields=['last_heartbeat_at'], name='jobs_worker_heartbeat_idx')],
                'constraints': [models.UniqueConstraint(fields=('kind', 'engine_id'), name='jobs_worker_identity')],
            },
        ),
        migrations.CreateModel(
            name='Dashboard',
            fields=[
            ],
            options={
                'verbose_name': 'dashboard',
                'verbose_name_plural': 'dashboard',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('jobs.workerrecord',),
        ),
        migrations.CreateModel(
            name='JobAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveIntegerField()),
                ('token', models.CharField(max_length=64)),
                ('status', models.CharField(choices=[('running', 'Running'), ('succeeded', 'Succeeded'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('interrupted', 'Interrupted'), ('snoozed', 'Snoozed'), ('released', 'Released')], default='running', max_length=16)),
                ('worker_id', models.CharField(blank=True, default='', max_length=200)),
                ('progress', models.FloatField(blank=True, null=True)),
                ('progress_message', models.TextField(blank=True, default='')),
                ('error', models.TextField(blank=True, default='')),
                ('result_ref', models.TextField(blank=True, null=True)),
                ('started_at', models.DateTimeField()),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
                ('job', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='attempts', to='jobs.job')),
            ],
            options={
                'ordering': ['job', 'number'],
                'constraints': [models.UniqueConstraint(fields=('job', 'number'), name='jobs_attempt_identity'), models.UniqueConstraint(fields=('token',), name='jobs_attempt_token')],
            },
        ),
        migrations.RunPython(attempt_fillfactor, default_fillfactor),
    ]
