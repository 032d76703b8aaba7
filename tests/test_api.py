"""`beam_jobs.build(...)`: the build from Python, with the CLI's checks raised as exceptions; and the notebook
page's snippet, run as written."""
from __future__ import annotations

import contextlib
import io
import re

import pytest
from conftest import REPO, write_images

import beam_jobs
from beam_jobs.api import option_args
from beam_jobs.jobs.options import parser

NOTEBOOKS = REPO / "docs" / "notebooks.md"


def actions():
    return {a.dest: a for a in parser()._actions if a.option_strings}


def test_keyword_arguments_become_the_commands_options():
    found = actions()
    assert option_args("image_size", (224, 160), found) == ["--image-size", "224,160"]
    assert option_args("splits", {"train": 0.9, "validation": 0.1}, found) == ["--splits", "train=0.9,validation=0.1"]
    assert option_args("stratify", True, found) == ["--stratify"] and option_args("stratify", False, found) == []
    assert option_args("listing", ["a.csv", "b.csv"], found) == ["--listing", "a.csv", "--listing", "b.csv"]
    assert option_args("progress", False, found) == ["--no-progress"]
    assert option_args("num_cores", 8, found) == ["--num-cores", "8"] and option_args("tpu", None, found) == []


def test_an_unknown_keyword_or_a_bad_value_raises_what_the_cli_prints(images, tmp_path):
    with pytest.raises(beam_jobs.UsageError, match=r"^build\(\) has no option 'image_sise'; did you mean image_size"):
        beam_jobs.build(images, tmp_path / "out", image_sise=224)
    with pytest.raises(ValueError, match=r"^--splits fractions add up to 1.1, not 1$"):
        beam_jobs.build(images, tmp_path / "out", splits={"train": 0.9, "valid": 0.2})
    with pytest.raises(beam_jobs.UsageError, match="--stratify needs --splits with two or more splits"):
        beam_jobs.build(images, tmp_path / "out", stratify=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_notebook_pages_build_snippet_runs_as_written(tmp_path, monkeypatch):
    [snippet] = re.findall(r"<!-- test: build-snippet -->\n```python\n(.*?)```", NOTEBOOKS.read_text(), re.S)
    write_images(tmp_path / "images", {"cat": 30, "dog": 30, "fish": 30}, size=(32, 24))
    monkeypatch.chdir(tmp_path)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(snippet, "notebooks.md", "exec"), {})
    lines = printed.getvalue().splitlines()
    assert "{'train': 72, 'validation': 18} ['cat', 'dog', 'fish']" in lines
    assert lines[-1] == "--splits fractions add up to 1.1, not 1"
    assert (tmp_path / "shards" / "manifest.json").is_file() and not (tmp_path / "shards-2").exists()
