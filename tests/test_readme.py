"""The README's getting-started path runs as written: its marked shell commands build the sample dataset, then
each marked Python snippet of the README and of the docs site's loader page runs, unchanged, in the same folder
(a snippet both hold runs once).

Marks: `<!-- test: commands -->` before a bash block (its `&&` steps run, except making the venv and pip
installs: this venv has them) and `<!-- test: snippet -->` before a Python block.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytest.importorskip("tensorflow")

README = REPO / "README.md"
LOADER_PAGE = REPO / "docs" / "loader.md"  # the docs site's own training snippet
_MARKED = re.compile(r"<!-- test: (commands|snippet) -->\n```(?:bash|python)\n(.*?)```", re.S)


def marked(kind: str, page: Path = README) -> list[str]:
    """A page's blocks marked `kind`, in order."""
    return [body for mark, body in _MARKED.findall(page.read_text(encoding="utf-8")) if mark == kind]


def steps(commands: str) -> list[str]:
    """The shell steps of a marked block, without making a venv or installing into it."""
    parts = [p.strip() for line in commands.splitlines() for p in line.split("&&") if p.strip()]
    return [p for p in parts if not p.startswith("python3.11 -m venv") and not re.search(r"\bpip install\b", p)]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, f"{shlex.join(args)}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_getting_started_runs_as_written(tmp_path):
    [commands] = marked("commands")
    snippets = marked("snippet")
    assert snippets and marked("snippet", LOADER_PAGE), "no marked snippet in the README or docs/loader.md"
    snippets += [s for s in marked("snippet", LOADER_PAGE) if s not in snippets]
    # A folder laid out as the README assumes: the checkout's examples/, and .venv/ being this Python's venv.
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    for step in steps(commands):
        run(shlex.split(step), tmp_path)
    assert (tmp_path / "sample_output" / "manifest.json").is_file()
    for i, snippet in enumerate(snippets):
        (tmp_path / f"snippet{i}.py").write_text(snippet)
        out = run([str(tmp_path / ".venv" / "bin" / "python"), f"snippet{i}.py"], tmp_path).stdout
        assert out.strip(), f"snippet {i} printed nothing"
    assert "['circle', 'square', 'triangle']" in out and "'accuracy'" in out and "'cross_entropy'" in out
