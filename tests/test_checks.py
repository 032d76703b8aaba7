"""The static checks pyproject.toml configures, run as part of the suite: ruff's lint and mypy on both packages."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    done = run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_mypy_finds_nothing_in_either_package():
    done = run("mypy", "--no-incremental")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
