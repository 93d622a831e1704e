"""What a test of the native kernels does when this machine cannot run it.

A tool the tests need (a C compiler, SIMDe, the aarch64 cross compiler, qemu) that is missing
skips the test on a developer's machine, but fails it under CI (``CI`` set to anything but
empty, 0 or false): .ci/run installs every such tool, so a missing one there is a broken
setup, never a reason to pass. An instruction set this machine (or this build) lacks never
vanishes from a parametrize list: it stays in the list as a skip that says why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NoReturn

import pytest

from edgeinfer import _native


def sanitizer_flags() -> list[str]:
    """setup.py's sanitizer flags when ``EDGEINFER_SANITIZE`` asks for sanitizers (the CI job
    .ci/sanitize), for the C checks the tests build themselves; else none."""
    import ast
    from pathlib import Path

    names = os.environ.get("EDGEINFER_SANITIZE", "").strip()
    if not names:
        return []
    setup_py = Path(__file__).resolve().parents[2] / "setup.py"
    for node in ast.parse(setup_py.read_text()).body:
        target = getattr(node.targets[0], "id", None) if isinstance(node, ast.Assign) else None
        if target == "SANITIZE_FLAGS":
            return [f"-fsanitize={names}", *ast.literal_eval(node.value)]
    raise LookupError("setup.py has no SANITIZE_FLAGS")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_tool(message: str) -> NoReturn:
    """Skips the test for want of a tool, or fails it under CI."""
    if in_ci():
        pytest.fail(f"{message}: .ci/run installs it, so CI must have it")
    pytest.skip(message)


def _why_not(name: str) -> str | None:
    """None when this build and CPU run the instruction set, else why not."""
    ok, why = _native.available()
    if not ok:
        return f"{name}: native library unavailable ({why})"
    report = next(r for r in _native.isa_report() if r["name"] == name)
    return None if report["supported"] else f"{name} is not available here: {report['reason']}"


def isa_params(names: Iterable[str]) -> list:
    """One parameter per instruction set: those this build and CPU cannot run are skipped,
    each with the dispatcher's reason."""
    params = []
    for name in names:
        why = _why_not(name)
        skip = pytest.mark.skipif(why is not None, reason=why or "")
        params.append(pytest.param(name, id=name, marks=skip))
    return params


def runnable_isas(names: Iterable[str]) -> list[str]:
    """The instruction sets among names that this build and CPU run."""
    return [name for name in names if _why_not(name) is None]
