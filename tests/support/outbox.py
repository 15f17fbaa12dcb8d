"""Real ``dispatch_outbox`` processes, and a transport they publish through that a test
can read afterwards and make fail.

:class:`LoggingTransport` is named by dotted path in ``OUTBOX_TRANSPORT`` (its
options, JSON, in ``OUTBOX_TRANSPORT_OPTIONS``). Every process appends to one log
file, a line at the start and one at the end of each message's publish (``O_APPEND``
writes of a line each, whole across processes), so that the test sees the order in
which messages reached "the broker" and whether two messages of one key were ever
being published at once.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outbox.exceptions import TransportUnavailable
from outbox.transports.base import Transport
from outbox.types import DeliveryReport, Envelope
from tests.support.procs import ManageProcess


class DispatcherProcess(ManageProcess):
    """``manage.py dispatch_outbox -v 2 …`` in a child process, outbox enabled."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        env = {"OUTBOX_ENABLED": "true", **(env or {})}
        super().__init__(tmp_path, "dispatch_outbox", "-v", "2", *args, env=env)

    def wait(self, timeout: float = 120) -> int:
        return super().wait(timeout)


class LoggingTransport(Transport):
    """Publishes a message by writing it to the ``log`` file.

    ``fail_ratio``: the share of messages that fail (each at random, seeded by the
    process id); ``down``: while this file exists every batch raises
    :class:`TransportUnavailable`, like a broker that is down; ``reject``: a file of
    message ids (one a line, read at each publish) that fail permanently, so that the
    dispatcher parks them.
    """

    name = "logging"
    supports_key_ordering = True

    def __init__(
        self, *, log: str, fail_ratio: float = 0.0, down: str = "", reject: str = ""
    ) -> None:
        super().__init__()
        self.log = log
        self.fail_ratio = fail_ratio
        self.down = Path(down) if down else None
        self.reject = Path(reject) if reject else None
        self.rng = random.Random(os.getpid())
        self.fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def publish(self, messages: Sequence[Envelope]) -> Sequence[DeliveryReport]:
        if self.down is not None and self.down.exists():
            self._write("down", messages[0])
            raise TransportUnavailable("the broker is down (test marker)")
        rejected = set()
        if self.reject is not None and self.reject.exists():
            rejected = set(self.reject.read_text().split())
        reports = []
        for envelope in messages:
            self._write("start", envelope)
            if str(envelope.message_id) in rejected:
                self._write("rejected", envelope)
                reports.append(
                    DeliveryReport.failed(envelope.message_id, "rejected", permanent=True)
                )
            elif self.rng.random() < self.fail_ratio:
                self._write("failed", envelope)
                reports.append(DeliveryReport.failed(envelope.message_id, "flaky broker"))
            else:
                self._write("sent", envelope)
                reports.append(DeliveryReport.delivered(envelope.message_id))
        return reports

    def _write(self, event: str, envelope: Envelope) -> None:
        key = envelope.key or "-"
        os.write(self.fd, f"{event} {os.getpid()} {envelope.message_id} {key}\n".encode())

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True, slots=True)
class LogLine:
    event: str
    pid: int
    message_id: str
    key: str


def read_log(path: Path) -> list[LogLine]:
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        event, pid, message_id, key = text.split(" ")
        lines.append(LogLine(event, int(pid), message_id, "" if key == "-" else key))
    return lines


def transport_env(log: Path, **options: Any) -> dict[str, str]:
    """The environment of a dispatcher that publishes through :class:`LoggingTransport`."""
    return {
        "OUTBOX_TRANSPORT": f"{LoggingTransport.__module__}.{LoggingTransport.__name__}",
        "OUTBOX_TRANSPORT_OPTIONS": json.dumps({"log": str(log), **options}),
    }


def order_violations(lines: Sequence[LogLine], stored: Mapping[str, Sequence[str]]) -> list[str]:
    """What breaks "one key at a time, in stored order" in a publishing log.

    ``stored``: each key's message ids in the order they were stored. For each key:
    a message's publish starts only after the key's previous publish ended (never two
    at once, in one process or two), and the messages that reached the broker (sent
    lines) come in stored order (one may come again, as at-least-once allows, but
    never after a later one).
    """
    position = {m: n for ids in stored.values() for n, m in enumerate(ids)}
    problems: list[str] = []
    publishing: dict[str, str] = {}
    reached: dict[str, int] = {}
    for line in lines:
        if not line.key or line.event == "down":
            continue
        if line.event == "start":
            if line.key in publishing:
                problems.append(
                    f"{line.message_id} started while {publishing[line.key]} of key "
                    f"{line.key} was being published"
                )
            publishing[line.key] = line.message_id
            continue
        publishing.pop(line.key, None)
        if line.event == "sent":
            at = position[line.message_id]
            if at < reached.get(line.key, -1):
                problems.append(f"{line.message_id} of key {line.key} reached the broker late")
            reached[line.key] = max(at, reached.get(line.key, -1))
    return problems


def sent_ids(lines: Sequence[LogLine]) -> Iterator[str]:
    return (line.message_id for line in lines if line.event == "sent")
