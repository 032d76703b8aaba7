"""The import rules the package layout stands for, checked on the source (every import, lazy ones too; imports
under `if TYPE_CHECKING:` do not run and are left out)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

PACKAGES = ("beam_jobs", "shard_utils")
# What each part of shard_utils may import from shard_utils (itself always): storage <- format <- the rest (text, the
# one way outside text is shown, below them all), and the read side never imports the write side (media,
# sharding); quality (pure functions on pixels and findings) imports only errors, and the read side may use it.
MAY_IMPORT = {
    "shard_utils.storage": {"shard_utils.extras", "shard_utils.errors", "shard_utils.text"},
    "shard_utils.format": {"shard_utils.storage", "shard_utils.extras", "shard_utils.errors", "shard_utils.text"},
    "shard_utils.inputs": {"shard_utils.storage", "shard_utils.format", "shard_utils.extras", "shard_utils.errors",
                           "shard_utils.text"},
    "shard_utils.read": {"shard_utils.storage", "shard_utils.format", "shard_utils.inputs", "shard_utils.extras",
                         "shard_utils.quality", "shard_utils.errors", "shard_utils.text"},
    "shard_utils.quality": {"shard_utils.errors", "shard_utils.text"},
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of the two packages (and apache_beam) that a module imports."""
    tree = ast.parse(path.read_text())
    skipped = _type_checking_lines(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skipped:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")[:len(name.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            if target.split(".")[0] == "apache_beam":
                out.add("apache_beam")
                continue
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def test_no_import_cycle(graph):
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v] - {"apache_beam"}:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_shard_utils_never_imports_beam(graph):
    assert sorted(m for m, deps in graph.items() if m.startswith("shard_utils") and "apache_beam" in deps) == []


def test_nothing_imports_the_command_line(graph):
    assert sorted(m for m, deps in graph.items() if "beam_jobs.cli" in deps) == []


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_each_part_imports_only_what_is_below_it(graph, part):
    wrong = {m: sorted(d for d in deps if d.startswith("shard_utils") and not d.startswith(part + ".")
                       and d != part and not any(d == a or d.startswith(a + ".") for a in MAY_IMPORT[part]))
             for m, deps in graph.items() if m == part or m.startswith(part + ".")}
    assert {m: d for m, d in wrong.items() if d} == {}


@pytest.mark.tf  # imports TensorFlow (the loader)
def test_the_public_import_paths_still_work():
    """What users type keeps working (thin re-exports of the modules' new homes)."""
    from shard_utils.index import read_index  # noqa: F401
    from shard_utils.loader import make_dataset
    from shard_utils.manifest import load  # noqa: F401
    from shard_utils.random_access import RandomAccessSource  # noqa: F401
    from shard_utils.read.loader import make_dataset as moved
    from shard_utils.read.report import write_report as reexported
    from shard_utils.read.report.page import write_report as written
    from shard_utils.report import contact_sheet, write_report  # noqa: F401
    from shard_utils.verify import verify  # noqa: F401

    assert make_dataset is moved
    assert write_report is reexported is written


def test_the_report_is_imported_through_its_package(graph):
    """The report's parts (sample, sheets, charts, rejects, page) are its own: other modules import
    `shard_utils.read.report`, so the parts can move without breaking anyone."""
    package = "shard_utils.read.report"
    assert sorted(m for m, deps in graph.items() if m != package and not m.startswith(package + ".")
                  and any(d.startswith(package + ".") for d in deps)) == []
