"""``manage.py run_test_saga NAME --data JSON [--key KEY]``: run a saga in this
process (the crash tests kill it at fault points)."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from sagas import SagaExecutionError, run_saga


class Command(BaseCommand):
    help = "Run one saga in this process and print its outcome."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--data", default="{}")
        parser.add_argument("--key", default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = run_saga(
                options["name"], json.loads(options["data"]), idempotency_key=options["key"]
            )
        except SagaExecutionError as exc:
            self.stdout.write(f"{exc.status.value} {exc.instance_id} failed at {exc.failed_step}")
            return
        self.stdout.write(f"{result.status.value} {result.instance_id}")
