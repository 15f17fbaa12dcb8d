
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
    ]

    operations = [
        migrations.CreateModel(
            name='InboxMessage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('consumer', models.CharField(max_length=100)),
                ('message_id', models.CharField(max_length=200)),
                ('processed_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'inbox message',
                'ordering': ['-processed_at', '-id'],
                'indexes': [models.Index(fields=['processed_at'], name='outbox_inbox_processed_idx')],
                'constraints': [models.UniqueConstraint(fields=('consumer', 'message_id'), name='outbox_inbox_identity')],
            },
        ),
        migrations.CreateModel(
            name='OutboxMessage',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('message_id', models.UUIDField(editable=False, unique=True)),
                ('event_type', models.CharField(max_length=200)),
                ('key', models.CharField(blank=True, default='', max_length=200)),
                ('payload_json', models.TextField()),
                ('headers', models.JSONField(blank=True, default=dict)),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('sent', 'Sent'), ('parked', 'Parked')], default='pending', max_length=16)),
                ('attempts', models.PositiveIntegerField(default=0)),
                ('available_at', models.DateTimeField()),
                ('last_error', models.TextField(blank=True, default='')),
                ('leased_by', models.CharField(blank=True, default='', max_length=200)),
                ('lease_token', models.CharField(blank=True, max_length=64, null=True)),
                ('lease_expires_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
                ('updated_at', models.DateTimeField()),
                ('sent_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'outbox message',
                'ordering': ['created_at', 'id'],
                'indexes': [models.Index(condition=models.Q(('lease_token__isnull', True), ('status', 'pending')), fields=['available_at', 'id'], name='outbox_msg_due_idx'), models.Index(condition=models.Q(('lease_token__isnull', False), ('status', 'pending')), fields=['lease_expires_at'], name='outbox_msg_leased_idx'), models.Index(condition=models.Q(('status', 'sent')), fields=['sent_at'], name='outbox_msg_sent_idx'), models.Index(fields=['status', 'event_type'], name='outbox_msg_status_type_idx'), models.Index(fields=['created_at'], name='outbox_msg_created_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('status__in', ['pending', 'sent', 'parked'])), name='outbox_message_status_valid'), models.CheckConstraint(condition=models.Q(('lease_token__isnull', True), ('status', 'pending'), _connector='OR'), name='outbox_message_lease_only_pending')],
            },
        ),
    ]
