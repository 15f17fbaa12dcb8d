"""docs/brokers.md stays true: its examples marked with a source are the code the test
suite runs, word for word, and the names it documents exist."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from outbox.transports.kafka import OPTIONS as KAFKA_OPTIONS
from outbox.transports.rabbitmq import OPTIONS as RABBITMQ_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "brokers.md"
SOURCED_BLOCK = re.compile(r"<!-- source: (?P<path>\S+) -->\n```python\n(?P<code>.*?)```", re.S)


def sourced_blocks() -> list[tuple[str, str]]:
    return [(m["path"], m["code"]) for m in SOURCED_BLOCK.finditer(DOC.read_text())]


def test_the_guide_has_sourced_examples():
    assert {path for path, _ in sourced_blocks()} == {
        "tests/processes/test_brokers_services.py",
        "testproject/settings.py",
    }


@pytest.mark.parametrize(("path", "code"), sourced_blocks())
def test_each_sourced_example_is_in_its_file(path: str, code: str):
    source = (ROOT / path).read_text()
    assert textwrap.dedent(code) in source, f"docs/brokers.md drifted from {path}"


@pytest.mark.parametrize(
    ("heading", "options"),
    [('"rabbitmq"', RABBITMQ_OPTIONS), ('"kafka"', KAFKA_OPTIONS)],
)
def test_every_transport_option_is_documented(heading: str, options: dict[str, object]):
    text = DOC.read_text()
    section = text.split(f"### `TRANSPORT_OPTIONS` for `{heading}`")[1].split("\n### ")[0]
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    assert documented == set(options)
