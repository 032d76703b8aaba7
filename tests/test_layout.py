"""The import rules the package layout stands for, checked on the source (every import, lazy ones too; imports
under `if TYPE_CHECKING:` do not run and are left out)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

PACKAGES = ("beam_jobs", "shard_utils")


def _su(*parts: str) -> set[str]:
    return {f"shard_utils.{p}" for p in parts}


def _bj(*parts: str) -> set[str]:
    return {f"beam_jobs.{p}" for p in parts}


# shard_utils's leaves (every part may import them) and its parts, each above what it may import.
LEAVES = _su("errors", "extras", "text")
SHARD_UTILS = {"shard_utils"} | LEAVES | _su("storage", "format", "inputs", "media", "sharding", "quality", "read")
# What each part of the two trees may import from them (itself always). A part is a package or a top-level module;
# each module belongs to the longest part its name starts with, and every module belongs to one.
# shard_utils: storage <- format <- {inputs, media, sharding}; format <- read; the read side never imports the write
# side (media, sharding); quality (pure functions on pixels and findings) imports only the leaves, and both sides
# may use it. The top-level modules are the public import paths: thin re-exports of read/ and format/.
# beam_jobs, walked as one build from the bottom: run (settings, identity, output claim, accounting) <- publish
# (finalising, Beam-free) <- pipeline (one module per step) <- jobs (options -> config -> graph -> run) <- the
# entry points (api, cli, build_shards). local (the worker pool) and progress sit beside run; errors gathers the
# one-line errors of every layer, so it sits just above shard_utils.
MAY_IMPORT = {
    "shard_utils": set(),  # the package's own __init__: a version and a docstring
    **{leaf: set() for leaf in LEAVES},
    "shard_utils.extras": _su("errors"),  # MissingExtra derives from errors.TpuShardsError, every error's base
    "shard_utils.storage": LEAVES,
    "shard_utils.format": LEAVES | _su("storage"),
    "shard_utils.inputs": LEAVES | _su("storage", "format"),
    "shard_utils.quality": LEAVES,
    "shard_utils.media": LEAVES | _su("storage", "format", "inputs", "quality"),
    "shard_utils.sharding": LEAVES | _su("storage", "format", "inputs", "media"),
    "shard_utils.read": LEAVES | _su("storage", "format", "inputs", "quality"),
    **{f"shard_utils.{name}": _su("read", "format") for name in (
        "epochs", "index", "jax_loader", "loader", "manifest", "random_access", "report", "resume", "tfds_meta",
        "verify")},
    "beam_jobs.errors": SHARD_UTILS,
    "beam_jobs.local": set(),
    "beam_jobs.run": SHARD_UTILS | _bj("errors"),
    "beam_jobs.progress": SHARD_UTILS | _bj("run"),
    "beam_jobs.publish": SHARD_UTILS | _bj("errors", "run"),
    "beam_jobs.pipeline": SHARD_UTILS | _bj("errors", "run", "local", "progress", "publish"),
    "beam_jobs.jobs": SHARD_UTILS | _bj("errors", "run", "local", "progress", "publish", "pipeline"),
    "beam_jobs.api": SHARD_UTILS | _bj("errors", "jobs"),
    "beam_jobs.build_shards": SHARD_UTILS | _bj("errors", "jobs"),
    "beam_jobs.cli": SHARD_UTILS | _bj("errors", "jobs", "progress"),
    "beam_jobs": _bj("errors", "api"),  # the package's own __init__: the public API
}
# The build's steps in the order they run (then the graph that joins them): a step may import those before it and
# `common`, never one that runs after it. The reshard's steps (fragments) run on the same StartRun and Publish.
STEPS = ("chunks", "common", "start", "listing_sources", "listing", "stratify", "near_dups", "plan_runs", "encode",
         "carry", "shards", "write", "fragments", "reports", "publish", "embed", "dataset")


def part_of(module: str) -> str | None:
    """The part of the layout a module belongs to: the longest declared part its name starts with."""
    found = [p for p in MAY_IMPORT if module == p or module.startswith(p + ".")]
    return max(found, key=len) if found else None


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


def _absolute(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The module an import-from names, relative imports made absolute."""
    base = node.module or ""
    if node.level:
        parts = name.split(".")[:len(name.split(".")) - node.level + (path.name == "__init__.py")]
        base = ".".join(parts + ([base] if base else []))
    return base


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
            base = _absolute(node, name, path)
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


def test_shard_utils_and_the_floors_of_beam_jobs_never_import_beam(graph):
    """shard_utils, the run floor and publishing are plain Python: Beam is the pipeline's and the jobs'."""
    beam_free = ("shard_utils", "beam_jobs.run", "beam_jobs.publish")
    assert sorted(m for m, deps in graph.items() if part_of(m) and part_of(m).startswith(beam_free)
                  and "apache_beam" in deps) == []


def test_nothing_imports_the_command_line(graph):
    assert sorted(m for m, deps in graph.items() if "beam_jobs.cli" in deps) == []


def test_every_module_belongs_to_a_declared_part():
    assert sorted(m for m in modules() if part_of(m) is None) == []


@pytest.mark.parametrize("part", sorted(MAY_IMPORT))
def test_each_part_imports_only_what_is_below_it(graph, part):
    wrong = {m: sorted(d for d in deps - {"apache_beam"} if part_of(d) not in (part, *MAY_IMPORT[part]))
             for m, deps in graph.items() if part_of(m) == part}
    assert {m: d for m, d in wrong.items() if d} == {}


def test_each_step_imports_only_the_steps_before_it(graph):
    """Walked in the order the build runs, the steps never import a later step: what two steps share lives in
    `common`, the run floor or shard_utils."""
    order = {f"beam_jobs.pipeline.{s}": i for i, s in enumerate(STEPS)}
    steps = [m for m in graph if m.startswith("beam_jobs.pipeline.")]
    assert sorted(set(steps) - set(order)) == []  # a new step is placed in STEPS
    wrong = {m: sorted(d for d in graph[m] if order.get(d, -1) > order[m]) for m in steps}
    assert {m: d for m, d in wrong.items() if d} == {}


def test_only_the_publish_step_imports_the_publish_package(graph):
    """The first step must not depend on the last: the other steps find the run floor below them instead."""
    assert sorted(m for m, deps in graph.items() if m.startswith("beam_jobs.pipeline.")
                  and any(d.startswith("beam_jobs.publish") for d in deps)) == ["beam_jobs.pipeline.publish"]


def test_no_private_name_crosses_a_package(graph):
    """A name with a leading underscore (a module or anything in one) is imported only inside its own part."""
    known = modules()
    wrong = []
    for name, path in known.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            base = _absolute(node, name, path) if isinstance(node, ast.ImportFrom) else ""
            for alias in node.names:
                target = f"{base}.{alias.name}" if base else alias.name
                if target.split(".")[0] not in PACKAGES or not any(
                        p.startswith("_") and not p.startswith("__") for p in target.split(".")):
                    continue
                owner = target
                while owner and owner not in known:
                    owner = owner.rpartition(".")[0]
                if part_of(owner) != part_of(name):
                    wrong.append(f"{name} <- {target}")
    assert wrong == []


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
