# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
"""Django's tasks documentation: task attributes customised through ``@task``."""

from django.core.mail import send_mail

from jobs.backends.compat import task


@task(priority=2, queue_name="emails")
def email_users(emails, subject, message):
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)
