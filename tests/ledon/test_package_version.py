"""The version every engine records in the workers registry is the installed
package's, read from its metadata's headers alone."""

from __future__ import annotations

from importlib.metadata import version

from ledon.registry import package_version


def test_the_recorded_version_is_the_installed_packages() -> None:
    assert package_version() == version("django-ledon")
    assert package_version() != "0"
