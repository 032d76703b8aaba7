"""The public surface of both packages: `__all__` on every public module, stable import paths that export only
their `__all__`, and one error base class (`TpuShardsError`) every exception the project defines derives from.

Read from the source (no import: TensorFlow and Beam stay out of this fast test), except where behaviour is checked.
"""
from __future__ import annotations

import ast
import builtins
import functools

import pytest
from conftest import REPO

from shard_utils.errors import InternalError, TpuShardsError

PACKAGES = ("shard_utils", "beam_jobs")
SHIMS = ("epochs", "index", "jax_loader", "loader", "manifest", "random_access", "report", "resume", "tfds_meta",
         "verify")  # shard_utils.<name>: the stable import paths users write


@functools.cache
def modules() -> dict[str, ast.Module]:
    """Every public module of both packages (no part of its dotted name starts with "_"), parsed."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if not any(part.startswith("_") for part in parts):
                out[".".join(parts)] = ast.parse(path.read_text(), str(path))
    return out


def declared_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id == "__all__":
            return list(ast.literal_eval(node.value))
    return None


def bound_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (definitions, assignments, imports)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def lazy_names(tree: ast.Module) -> set[str]:
    """Names a module-level `__getattr__` returns (`if name == "X"` / `if name in ("X", ...)`)."""
    getattr_fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"), None)
    if getattr_fn is None:
        return set()
    return {c.value for node in ast.walk(getattr_fn) if isinstance(node, ast.Compare)
            for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)}


def test_every_public_module_declares_all_and_each_name_exists():
    found = modules()
    assert len(found) > 100 and "shard_utils.manifest" in found and "beam_jobs.pipeline.start" in found
    missing = [name for name, tree in found.items() if declared_all(tree) is None]
    assert not missing, f"public modules without __all__: {missing}"
    for name, tree in found.items():
        declared = declared_all(tree)
        assert len(declared) == len(set(declared)), f"{name}: __all__ names a name twice"
        unbound = set(declared) - bound_names(tree) - lazy_names(tree) - submodules(name)
        assert not unbound, f"{name}: __all__ names {sorted(unbound)}, which the module does not define"


def submodules(name: str) -> set[str]:
    folder = REPO / name.replace(".", "/")
    return {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()} \
        if folder.is_dir() else set()


@pytest.mark.parametrize("shim", SHIMS)
def test_stable_import_paths_export_only_their_all(shim):
    tree = modules()[f"shard_utils.{shim}"]
    declared = declared_all(tree)
    public = {n for n in bound_names(tree) if not n.startswith("_")}
    assert declared and public == set(declared), sorted(public ^ set(declared))
    assert not any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in tree.body)


def test_a_stable_path_no_longer_leaks_its_imports():
    import shard_utils.manifest as stable
    from shard_utils.format import manifest

    assert stable.__all__ == manifest.__all__ and stable.load is manifest.load
    assert not {"json", "re", "storage"} & set(vars(stable)), "the stable path re-exports the module's imports"


def class_bases() -> dict[str, list[str]]:
    """Every class the packages define, by qualified name, with its bases' (last) names."""
    classes = {}
    for module, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes[f"{module}.{node.name}"] = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")
                                                    for b in node.bases]
    return classes


def test_every_exception_the_packages_define_derives_from_one_base():
    classes = class_bases()
    bases_by_name: dict[str, set[str]] = {}
    for qualified, bases in classes.items():
        bases_by_name.setdefault(qualified.rsplit(".", 1)[1], set()).update(bases)

    def ancestors(name: str, seen: frozenset = frozenset()) -> set[str]:
        out = set()
        for base in bases_by_name.get(name, ()):
            if base not in seen:
                out |= {base} | ancestors(base, seen | {name})
        return out

    def builtin_exception(name: str) -> bool:
        found = getattr(builtins, name, None)
        return isinstance(found, type) and issubclass(found, BaseException)

    errors = {q: ancestors(q.rsplit(".", 1)[1]) for q in classes}
    errors = {q: up for q, up in errors.items() if any(map(builtin_exception, up))}
    assert len(errors) >= 28 and "shard_utils.format.manifest.ManifestError" in errors
    outside = sorted(q for q, up in errors.items() if "TpuShardsError" not in up and not q.endswith(".TpuShardsError"))
    assert not outside, f"exceptions without the common base: {outside}"


def test_errors_keep_their_builtin_base_and_the_command_line_prints_any_as_one_line(capsys):
    from beam_jobs.errors import guarded
    from shard_utils import storage
    from shard_utils.format.topology import TopologyError
    from shard_utils.storage._local import NotRegularFile

    assert issubclass(storage.NotFoundError, TpuShardsError) and issubclass(TopologyError, ValueError)
    assert issubclass(NotRegularFile, OSError) and issubclass(NotRegularFile, TpuShardsError)
    try:
        raise TopologyError("unknown TPU type 'v9-8'")
    except ValueError as exc:  # handlers written for the built-in base still catch it
        assert isinstance(exc, TpuShardsError)

    def failing(error: Exception):
        def command(argv):
            raise error
        return command

    assert guarded(failing(TopologyError("unknown TPU type 'v9-8'\nsecond line")), []) == 1
    assert capsys.readouterr().err == "tpu-shards: error: unknown TPU type 'v9-8'\n"
    assert guarded(failing(InternalError("shard 3 got 5 records")), []) == 3  # a bug stays an internal error
    assert "internal error: InternalError" in capsys.readouterr().err
