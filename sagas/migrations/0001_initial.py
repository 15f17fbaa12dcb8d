
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='SagaInstance',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('instance_id', models.UUIDField(default=uuid.uuid4, editable=False, unique=True)),
                ('name', models.CharField(max_length=200)),
                ('idempotency_key', models.CharField(blank=True, max_length=200, null=True)),
                ('steps', models.JSONField(default=list, help_text='The step names, in order, at start.')),
                ('completed_steps', models.JSONField(default=list)),
                ('compensated_steps', models.JSONField(default=list)),
                ('uncompensated_steps', models.JSONField(default=list, help_text='Completed steps that define no compensation: their effects remain.')),
                ('data', models.JSONField(default=dict)),
                ('request_digest', models.CharField(blank=True, default='', max_length=64)),
                ('status', models.CharField(choices=[('running', 'Running'), ('compensating', 'Compensating'), ('succeeded', 'Succeeded'), ('compensated', 'Compensated'), ('failed', 'Failed (needs attention)')], default='running', max_length=16)),
                ('failed_step', models.CharField(blank=True, default='', max_length=100)),
                ('error', models.TextField(blank=True, default='')),
                ('compensation_error', models.TextField(blank=True, default='')),
                ('leased_by', models.CharField(blank=True, default='', max_length=200)),
                ('leased_until', models.DateTimeField(blank=True, null=True)),
                ('version', models.PositiveBigIntegerField(default=0)),
                ('takeovers', models.PositiveIntegerField(default=0)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('finished_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'saga instance',
                'indexes': [models.Index(condition=models.Q(('status__in', ['running', 'compensating'])), fields=['leased_until'], name='sagas_instance_claimable'), models.Index(fields=['status', 'name'], name='sagas_instance_status'), models.Index(condition=models.Q(('status__in', ['succeeded', 'compensated'])), fields=['finished_at'], name='sagas_instance_finished')],
                'constraints': [models.UniqueConstraint(fields=('name', 'idempotency_key'), name='sagas_instance_idempotency')],
            },
        ),
    ]
