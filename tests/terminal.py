"""Run a command with a pseudo-terminal as its stdin, stdout and stderr, as a user's shell would."""
from __future__ import annotations

import os
import pty
import subprocess


def run_in_terminal(cmd: list[str], *, cwd, env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """(exit code, everything the command wrote to the terminal)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=follower, stdout=follower, stderr=follower, cwd=cwd, env=env)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the command closed the terminal's last descriptor
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    return proc.wait(timeout=timeout), seen.decode("utf-8", "replace")
