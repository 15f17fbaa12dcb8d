"""The shape the architecture promises (docs/architecture.md), checked on the code:
the import contracts of pyproject.toml hold, no app has an import cycle (local imports
included), every local import that stays says why, and the admins write nothing
themselves."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jobs", "outbox", "sagas", "workflows", "ledon")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def test_the_import_contracts_hold():
    """lint-imports (the contracts in pyproject.toml), as scripts/test.sh runs it."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-logo", "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def strongly_connected(graph: grimp.ImportGraph, modules: set[str]) -> list[set[str]]:
    """The import cycles among ``modules``: each set of two or more modules that all
    reach each other (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def edges(module: str) -> list[str]:
        return sorted(m for m in graph.find_modules_directly_imported_by(module) if m in modules)

    for start in sorted(modules):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(edges(start))))
        while work:
            module, pending = work[-1]
            for target in pending:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges(target))))
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(component)
    return found


def test_the_cycle_finder_finds_a_cycle_behind_a_local_import():
    graph = grimp.ImportGraph()
    for module in ("app", "app.api", "app.registry", "app.types"):
        graph.add_module(module)
    graph.add_import(importer="app.api", imported="app.registry")
    graph.add_import(importer="app.registry", imported="app.api")  # a function-local one
    graph.add_import(importer="app.api", imported="app.types")
    assert strongly_connected(graph, set(graph.modules)) == [{"app.api", "app.registry"}]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_within_an_app(graph, package):
    """grimp reads every import statement, those inside functions too."""
    modules = {m for m in graph.modules if m.split(".")[0] == package and ".migrations" not in m}
    cycles = strongly_connected(graph, modules)
    described = [
        " <-> ".join(sorted(cycle))
        + ": "
        + "; ".join(
            f"{a} -> {b} (line {detail['line_number']})"
            for a in sorted(cycle)
            for b in sorted(cycle)
            for detail in graph.get_import_details(importer=a, imported=b)
        )
        for cycle in cycles
    ]
    assert not described, described


def local_imports(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, the import, whether a comment says why) of each import inside a
    function. The comment may end the import's line, or stand on the line above the
    block of imports the import belongs to."""
    lines = path.read_text().splitlines()
    for node in ast.walk(ast.parse("\n".join(lines))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if not isinstance(inner, ast.Import | ast.ImportFrom):
                continue
            first = inner.lineno - 1  # 0-based: the first line of the block of imports
            while first > 0 and (
                not lines[first - 1].strip()
                or lines[first - 1].strip().startswith(("from ", "import "))
            ):
                first -= 1
            said = any("#" in line for line in lines[first : inner.end_lineno])
            said = said or (first > 0 and lines[first - 1].strip().startswith("#"))
            yield inner.lineno, lines[inner.lineno - 1].strip(), said


def test_every_local_import_says_why():
    """An import inside a function hides a dependency from whoever reads the top of
    the module: one that must stay says why in a comment beside it (or just above,
    for the imports of one block)."""
    silent = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            for line, statement, said in local_imports(path):
                if not said:
                    silent.append(f"{path.relative_to(ROOT)}:{line}: {statement}")
    assert not silent, silent


ADMIN_MODULES = (
    "jobs/admin.py",
    "jobs/schedules/admin.py",
    "jobs/observability/admin.py",
    "outbox/admin.py",
    "sagas/admin.py",
    "workflows/admin.py",
)

#: What writes rows (or opens the door to raw SQL) when an admin calls it itself.
WRITES = {
    "update",
    "save",
    "delete",
    "create",
    "bulk_create",
    "bulk_update",
    "get_or_create",
    "update_or_create",
    "raw",
    "execute",
    "cursor",
}
#: ModelAdmin hooks that write; the admins are read-only and must not override them.
WRITING_HOOKS = {"save_model", "delete_model", "save_formset", "save_related", "delete_queryset"}


@pytest.mark.parametrize("module", ADMIN_MODULES)
def test_the_admin_writes_only_through_its_store(module):
    tree = ast.parse((ROOT / module).read_text())
    problems = []
    for node in ast.walk(tree):
        call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        if call and node.func.attr in WRITES:
            problems.append(f"line {node.lineno}: calls .{node.func.attr}()")
        if isinstance(node, ast.ImportFrom) and node.module in ("django.db", "django.db.backends"):
            for alias in node.names:
                if alias.name in {"connection", "connections", "transaction", "router"}:
                    problems.append(f"line {node.lineno}: imports django.db.{alias.name}")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in WRITING_HOOKS:
            problems.append(f"line {node.lineno}: overrides {node.name}()")
    assert not problems, problems


def test_the_admin_check_sees_a_write():
    """The check above is not blind: a direct write in admin code is reported."""
    tree = ast.parse("def act(self, request, queryset):\n    queryset.update(status='x')\n")
    calls = [
        n.func.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    ]
    assert WRITES & set(calls) == {"update"}


@pytest.mark.parametrize("package", ["jobs", "jobs.schedules", "outbox", "sagas", "workflows"])
def test_each_lazy_public_name_resolves_from_the_module_it_is_listed_in(package):
    module = __import__(package, fromlist=["_LAZY"])
    assert sorted(module.__all__) == sorted(module._LAZY)
    for name in module.__all__:
        assert getattr(module, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        module.nonexistent  # noqa: B018


@pytest.mark.parametrize("package", ["jobs", "outbox", "sagas", "workflows"])
def test_each_app_exports_its_root_error_and_the_errors_callers_catch(package):
    """``from <app> import <Root>Error`` catches any error of the app, as the root's
    docstring promises; every error the package exports from its exceptions module
    is under that root."""
    from ledon.errors import DocumentedError

    module = __import__(package, fromlist=["_LAZY"])
    exceptions = __import__(f"{package}.exceptions", fromlist=["__name__"])
    (root,) = [
        value
        for value in vars(exceptions).values()
        if isinstance(value, type) and DocumentedError in value.__bases__
    ]
    assert getattr(module, root.__name__) is root
    exported = [
        getattr(module, name) for name, home in module._LAZY.items() if home == "exceptions"
    ]
    assert root in exported
    for error in exported:
        assert issubclass(error, root), error
        assert getattr(exceptions, error.__name__) is error, error


def test_workflows_exports_the_errors_a_body_and_its_callers_catch():
    import workflows
    from workflows import exceptions

    for name in (
        "StepFailed",
        "SignalTimeout",
        "WorkflowIdentityConflict",
        "RunNotFound",
        "SignalConflict",
    ):
        assert getattr(workflows, name) is getattr(exceptions, name), name


#: The longest library module each app may have: workflows is held to a shorter one.
LINE_LIMITS = {"workflows": 600, "jobs": 800, "outbox": 800, "sagas": 800, "ledon": 800}


def test_no_library_module_is_over_its_line_limit():
    """Modules split by concept: none over 800 lines, none in workflows over 600.
    Migrations are generated, not written, and are left out."""
    over = [
        f"{path.relative_to(ROOT)}: {lines} lines (limit {limit})"
        for package, limit in LINE_LIMITS.items()
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts and (lines := len(path.read_text().splitlines())) > limit
    ]
    assert not over, "\n".join(over)
