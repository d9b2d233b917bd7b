"""The code's shape, as docs/architecture.md promises it: modules small enough to read in one
sitting, no import circles, and every import pointing down the map (an app uses only the apps
below it; the contract and the worker use nothing of Django)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import BASE_DIR

PACKAGES = ("contract", "apps", "worker", "chatsite", "core", "devstack")
MAX_LINES = 400
MAX_MODULES_PER_APP = 30  # migrations and management commands aside
# The map, bottom first: each layer may import the layers before it, never those after.
LAYERS = [
    ("contract",),  # what both sides of Redis agree on: stands on nothing
    ("worker",),
    ("core", "chatsite.settings"),  # settings are read by everything, and read nothing back
    ("apps.accounts",),
    ("apps.streams",),
    ("apps.admission",),
    ("apps.rag",),
    ("apps.inbox",),
    ("apps.usage",),  # written by the recorder (apps.chat), read by the API and the admin
    ("apps.chat",),
    ("apps.api",),
    ("apps.ops",),
    ("chatsite",),  # the roof: urls, asgi and routing compose everything
    ("devstack",),  # development tooling that starts the whole service
]


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (BASE_DIR / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(BASE_DIR).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules `name` imports anywhere in its body (a function-level import hides a
    circle but does not remove it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(module: str) -> int:
    best, rank = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), index
    return rank


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def test_no_module_is_too_long_to_read_in_one_sitting():
    long = {
        name: n
        for name, path in project_modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, long


def test_no_app_is_a_warehouse():
    counts: dict[str, int] = {}
    for name, path in project_modules().items():
        if name.startswith("apps.") and "management" not in path.parts:
            app = name.split(".")[1]
            counts[app] = counts.get(app, 0) + (path.name != "__init__.py")
    crowded = {app: n for app, n in counts.items() if n > MAX_MODULES_PER_APP}
    assert not crowded, crowded


def test_chatsite_is_only_the_roof():
    roof = {"__init__", "urls", "asgi", "routing", "settings"}
    extra = sorted(
        path.name
        for path in (BASE_DIR / "chatsite").iterdir()
        if path.suffix == ".py" and path.stem not in roof
    )
    assert not extra, extra


def test_no_import_circles():
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            # A package and its own modules (`from . import x` in __init__) are one unit.
            if len({m for m in component if not any(m.startswith(o + ".") for o in component)}) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    assert not circles, circles


def test_imports_point_down_the_map():
    upward = []
    for module, targets in import_graph().items():
        for target in targets:
            if layer_of(target) > layer_of(module):
                upward.append(f"{module} -> {target}")
    assert not upward, upward


def test_the_worker_needs_nothing_of_django():
    for module, path in project_modules().items():
        if module.startswith("worker"):
            tree = ast.parse(path.read_text())
            names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            assert not [n for n in names if n.split(".")[0] in ("django", "apps", "chatsite")], (
                module
            )


def callers_of(function: str) -> set[str]:
    """Project modules (tests and benches aside) that call `function` by its last name, e.g.
    `transitions.submitted(...)` or `submitted(...)` imported by name."""
    name = function.rpartition(".")[2]
    found = set()
    for module, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = node.func
                if isinstance(called, ast.Attribute) and called.attr == name:
                    found.add(module)
                elif isinstance(called, ast.Name) and called.id == name:
                    found.add(module)
    return found - {function.rpartition(".")[0]}


def test_every_request_enters_redis_through_one_publish():
    """A request of any kind (a person's, the OpenAI API's, Sluice's background work) is
    published by apps.chat.publish alone, and a person's question is submitted by
    apps.chat.submission.request_submit alone: the kind, the prompt and the tabs' event are
    decided in one place."""
    assert callers_of("contract.transitions.submitted") == {"apps.chat.publish"}
    assert callers_of("apps.chat.publish.request_publish") == {
        "apps.chat.submission",
        "apps.chat.background",
        "apps.api.openai_views",
    }
    assert callers_of("apps.chat.submission.request_submit") == {
        "apps.chat.turns",
        "apps.chat.consumers",
        "apps.chat.views",
        "apps.api.rest",
    }


def top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [
        n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level
    ]
    return {n.split(".")[0] for n in names if n}


def test_the_contract_stands_on_nothing_and_both_sides_stand_on_it():
    """contract/ is what the web and the workers agree on in Redis: it imports nothing of Sluice
    but itself and nothing of Django, and the worker and the Django side both stand on it."""
    graph = import_graph()
    modules = project_modules()
    contract = {m for m in graph if m == "contract" or m.startswith("contract.")}
    assert contract - {"contract"}
    outside = sorted(f"{m} -> {t}" for m in contract for t in graph[m] if t not in contract)
    assert not outside, outside
    for module in contract:
        found = top_level_imports(modules[module]) & {"django", "channels", *PACKAGES, "tests"}
        assert found <= {"contract"}, (module, found)
    importers = {m.split(".")[0] for m, targets in graph.items() if targets & contract}
    assert {"worker", "apps", "core"} <= importers, importers
