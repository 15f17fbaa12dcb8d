# mypy: disallow-untyped-defs=False, disallow-incomplete-defs=False
"""The examples of Django's tasks documentation, unchanged (topics/tasks).

The worker imports this module like every app's ``tasks`` module. Two examples
define another ``email_users``; they live in ``docs_priority`` and ``docs_context``.
``process_data`` is named by the documentation without being shown; it is defined
here so that its example can run.
"""

from django.core.mail import send_mail

from jobs.backends.compat import task

from .models import Thing


@task
def email_users(emails, subject, message):
    return send_mail(subject=subject, message=message, from_email=None, recipient_list=emails)


@task()
def double_dictionary(key):
    return {key: key * 2}


@task
def my_task(thing_num):
    Thing.objects.get(num=thing_num)


@task
def process_data(data):
    return data
