"""Helpers for driving the `edgeinfer` command as a user would: in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.api.conftest import ENGINE

EDGEINFER = str(Path(sys.executable).with_name("edgeinfer"))  # the installed console script


def cli(
    *args: str, input: str | None = None, env: dict | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Runs ``edgeinfer ARGS`` to completion; stdout and stderr as text."""
    return subprocess.run(
        [EDGEINFER, *map(str, args)], input=input, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, stdin=None if input is not None else subprocess.DEVNULL,
    )  # fmt: skip


def engine_args() -> list[str]:
    return ["--engine", ENGINE]


def assert_one_line_error(proc: subprocess.CompletedProcess, status: int = 1) -> str:
    """Exit ``status`` (1: a runtime error, 2: a usage error), and stderr is exactly one line
    that starts with 'edgeinfer: error:'."""
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("edgeinfer: error: "), proc.stderr
    assert proc.stdout == ""
    return lines[0]
