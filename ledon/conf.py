"""What the three apps' settings share: where their reference lives, and the message
for keys that do not exist (with the key that was probably meant)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

#: The published documentation; its settings reference is ``settings.html``
#: (``docs/settings.md`` in the source).
DOCS_URL = "https://django-ledon.readthedocs.io/en/latest/"


def settings_reference(setting: str) -> str:
    """The address of ``setting``'s section of the settings reference."""
    return f"{DOCS_URL}settings.html#{setting.lower()}"


def settings_hint(setting: str) -> str:
    """The hint of a system check about ``setting`` (JOBS, OUTBOX, SAGAS, TASKS)."""
    return f"See the {setting} settings reference: {settings_reference(setting)}"


def unknown_keys_message(what: str, unknown: Iterable[str], known: Iterable[str]) -> str:
    """``unknown JOBS setting(s): LEASE_SECOND (did you mean 'LEASE_SECONDS'?)`` for
    ``what="JOBS setting(s)"``: each unknown key with the known key it is closest to,
    if one is close enough to be a misspelling."""
    choices = sorted(known)
    parts = []
    for key in sorted(unknown):
        close = difflib.get_close_matches(key, choices, n=1, cutoff=0.7)
        parts.append(f"{key} (did you mean {close[0]!r}?)" if close else key)
    return f"unknown {what}: {', '.join(parts)}"
