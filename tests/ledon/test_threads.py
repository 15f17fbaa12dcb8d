"""No ``threading.Thread`` subclass in the apps shadows an attribute of ``Thread``.

Python 3.12's ``Thread.join()`` calls the private ``Thread._stop()``; a subclass that
assigned ``self._stop = threading.Event()`` made every join raise ``TypeError: 'Event'
object is not callable`` there (3.13 no longer has ``_stop``, so only 3.12 showed it).
The check reads each subclass's source, so it holds whatever interpreter runs it."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import textwrap
import threading
from types import ModuleType

import pytest

PACKAGES = ["ledon", "jobs", "outbox", "sagas"]

#: Private attributes of ``threading.Thread`` on Python 3.12 and 3.13 (class and
#: instance), besides whatever the running interpreter has.
KNOWN_PRIVATE = {
    "_after_fork", "_args", "_bootstrap", "_bootstrap_inner", "_daemonic", "_delete",
    "_handle", "_ident", "_initialized", "_invoke_excepthook", "_is_stopped", "_kwargs",
    "_name", "_native_id", "_reset_internal_locks", "_set_ident", "_set_native_id",
    "_set_tstate_lock", "_started", "_stderr", "_stop", "_target", "_tstate_lock",
    "_wait_for_tstate_lock",
}  # fmt: skip

#: What a subclass is meant to override or set.
MEANT_TO_BE_SET = {"run", "__init__", "__repr__", "name", "daemon"}


def thread_attributes() -> set[str]:
    running = set(vars(threading.Thread()))
    for cls in threading.Thread.__mro__:
        if cls is not object:
            running |= set(vars(cls))
    return (running | KNOWN_PRIVATE) - MEANT_TO_BE_SET


def shadowed(cls: type) -> list[str]:
    """The attributes of ``Thread`` that ``cls`` defines in its body or assigns on
    ``self`` anywhere in its methods."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    names: set[str] = set()
    for node in body.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(body):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.value, ast.Name)
                    and part.value.id == "self"
                ):
                    names.add(part.attr)
    return sorted(names & thread_attributes())


def modules() -> list[ModuleType]:
    found = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        found.append(package)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if ".migrations" in info.name:
                continue
            found.append(importlib.import_module(info.name))
    return found


def thread_subclasses() -> list[type]:
    classes = {
        cls
        for module in modules()
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, threading.Thread)
        and cls is not threading.Thread
        and cls.__module__.split(".")[0] in PACKAGES
    }
    return sorted(classes, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_the_check_catches_a_subclass_that_shadows_thread_stop():
    class Broken(threading.Thread):
        def __init__(self) -> None:
            super().__init__(daemon=True)
            self._stop = threading.Event()  # type: ignore[assignment]
            self.ready = threading.Event()

        def _wait_for_tstate_lock(self) -> None:
            pass

    class Fine(threading.Thread):
        def __init__(self) -> None:
            super().__init__(name="fine", daemon=True)
            self._stop_requested = threading.Event()

        def run(self) -> None:
            self.name = "renamed"

    assert shadowed(Broken) == ["_stop", "_wait_for_tstate_lock"]
    assert shadowed(Fine) == []


def test_the_apps_have_thread_subclasses_to_check():
    names = {cls.__qualname__ for cls in thread_subclasses()}
    assert {"Listener", "_BatchLeaseKeeper", "LeaseKeeper", "StepThread"} <= names


@pytest.mark.parametrize("cls", thread_subclasses(), ids=lambda c: c.__qualname__)
def test_no_thread_subclass_shadows_an_attribute_of_thread(cls: type):
    assert shadowed(cls) == []
