"""The documentation holds together: the MkDocs site builds with warnings as errors (a broken link or anchor,
a page missing from the nav, a module mkdocstrings cannot render), every relative link in the README leads
to a file (and to a heading, when it names one in a docs page), and the getting-started page repeats the
README's two commands as they are."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO
from markdown.extensions.toc import slugify  # what MkDocs makes heading ids with (mkdocs needs Markdown)

README = REPO / "README.md"
DOCS = REPO / "docs"
FENCED = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
URL_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.M)
API_OBJECTS = ["shard_utils.read.loader.make_dataset", "shard_utils.read.loader.eval_steps",
               "shard_utils.read.jax_loader.make_iterator", "shard_utils.read.jax_loader.GlobalBatches",
               "shard_utils.read.random_access.RandomAccessSource", "shard_utils.read.random_access.host_slice",
               "shard_utils.format.manifest.load", "shard_utils.format.manifest.Manifest",
               "shard_utils.format.index.read_index", "shard_utils.read.verify.verify",
               "shard_utils.read.tfds_meta.tfds_files", "beam_jobs.api.build"]


def relative_links(markdown: str) -> list[str]:
    """Link targets outside code blocks that are neither URLs nor anchors of the same page."""
    text = FENCED.sub("", markdown)
    return [t for t in LINK.findall(text) if not URL_SCHEME.match(t) and not t.startswith("#")]


def heading_ids(markdown: str) -> set[str]:
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in HEADING.findall(FENCED.sub("", markdown))}


@pytest.mark.slow  # matplotlib/mkdocs: about 3 CPU seconds, at the fast subset's limit under load
def test_the_docs_site_builds_with_warnings_as_errors(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in API_OBJECTS if f'id="{name}"' not in api]
    assert not missing, f"the API reference no longer renders {missing}"


def test_every_relative_link_in_the_readme_leads_to_a_file():
    targets = relative_links(README.read_text(encoding="utf-8"))
    assert any(t.startswith("docs/") for t in targets), "the README links no docs page"
    broken = []
    for target in targets:
        path, _, anchor = target.partition("#")
        file = REPO / path
        if not file.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in heading_ids(file.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with that id")
    assert not broken, broken


def test_the_getting_started_page_repeats_the_readmes_commands():
    commands = re.findall(r"```bash\n(python3\.11 -m venv [^\n]*)\n```", README.read_text(encoding="utf-8"))
    assert len(commands) == 2, "the README's try-it and test commands"
    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    assert [c for c in commands if c not in page] == []


def test_the_getting_started_page_names_every_build_option_and_every_extra():
    """Its option table covers what `build --help` lists, and its extras table every extra of setup.py."""
    import argparse
    import ast

    from beam_jobs.jobs.options import parser

    page = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(--[a-z][a-z-]*)", page))
    options = {o for action in parser()._actions for o in action.option_strings
               if action.help != argparse.SUPPRESS and o.startswith("--") and "_" not in o
               and o not in ("--help", "--input", "--output")}
    assert sorted(options - documented) == []
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    [call] = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup"]
    extras = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "extras_require"))
    assert sorted(set(extras) - set(re.findall(r"^\| `([a-z_]+)` \|", page, re.M))) == []
