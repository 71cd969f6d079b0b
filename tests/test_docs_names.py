"""``docs/architecture.md`` names only what exists: every ``path/module.py`` it names is a file,
every class it names (``PublishOptions``) is a class of the package, and every
``Class.attribute`` is defined in that class. The table of ``docs/ui.md`` that says which browser
test covers what names only tests that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "airflow_provider_liftbridge"
DOC = ROOT / "docs" / "architecture.md"

_MODULE = re.compile(r"(?<![\w/.])((?:[a-z_][\w]*/)*[a-z_]\w*\.py)\b")
_CLASS = re.compile(r"`([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+)(?:\.(\w+))?")


def _classes() -> dict[str, set[str]]:
    """Every class of the package and the names defined in its body (methods, attributes)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if "_proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = found.setdefault(node.name, set())
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return found


def _exists(module: str) -> bool:
    # From the package, the repository, or the client (the page is the client's: ``transport/sync.py``).
    if any((base / module).is_file() for base in (PACKAGE, ROOT, PACKAGE / "client")):
        return True
    # A bare name in the tree of the client's rooms (``settings.py`` under ``client/``).
    return "/" not in module and any(PACKAGE.rglob(module))


def test_every_module_named_exists() -> None:
    named = set(_MODULE.findall(DOC.read_text(encoding="utf-8")))
    assert len(named) > 20  # the maps name the files; the pattern must see them
    assert sorted(m for m in named if not _exists(m)) == []


def test_every_class_and_member_named_exists() -> None:
    classes = _classes()
    text = DOC.read_text(encoding="utf-8")
    missing = []
    for name, member in _CLASS.findall(text):
        if name not in classes:
            missing.append(name)
        elif member and member not in classes[name]:
            missing.append(f"{name}.{member}")
    assert missing == []


def test_the_check_sees_a_name_that_does_not_exist() -> None:
    assert not _exists("client/publishing/nowhere.py")
    assert "LiftbridgePublishRecordsOperator" not in _classes()


def _coverage_table() -> str:
    """The section "What the browser tests cover" of ``docs/ui.md``."""
    text = (ROOT / "docs" / "ui.md").read_text(encoding="utf-8")
    return text.split("## What the browser tests cover", 1)[1].split("\n## ", 1)[0]


def test_the_ui_coverage_table_names_only_system_tests_that_exist() -> None:
    """Every ``test_ui*.py`` module and ``test_*`` function the table of ``docs/ui.md`` names is in
    ``tests/system`` (the table says which test covers a cell: a renamed test must not leave it stale)."""
    system = ROOT / "tests" / "system"
    table = _coverage_table()
    modules = set(re.findall(r"\b(test_ui\w*)\.py", table))
    tests = set(re.findall(r"\b(test_\w+)\b(?!\.py)", table))
    defined = {
        node.name
        for path in system.glob("test_ui*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef)
    }
    assert len(tests) > 10 and modules
    assert sorted(m for m in modules if not (system / f"{m}.py").is_file()) == []
    assert sorted(tests - defined) == []
