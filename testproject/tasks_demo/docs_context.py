# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
"""Django's tasks documentation: a task that takes its context."""

import logging

from django.core.mail import send_mail

from jobs.backends.compat import task

logger = logging.getLogger(__name__)


@task(takes_context=True)
def email_users(context, emails, subject, message):
    logger.debug(
        f"Attempt {context.attempt} to send user email. Task result id: {context.task_result.id}."  # noqa: G004
    )
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)
