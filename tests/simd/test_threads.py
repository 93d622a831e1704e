"""The native thread pool on a number of threads that changes from task to task, and the
policy that picks that number for decoding steps (simd/common/step_threads.c), through the C
driver tests/simd/check_threads.c: built plainly and under ThreadSanitizer, whose report of
any data race fails the run."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.simd.platform_gates import missing_tool

ROOT = Path(__file__).resolve().parents[2]
COMMON = ROOT / "simd" / "common"
SOURCES = [COMMON / "threadpool.c", COMMON / "step_threads.c", COMMON / "profile.c"]


def _build(tmp_path: Path, name: str, flags: list[str]) -> Path:
    cc = shutil.which("gcc")
    if cc is None:
        missing_tool("gcc is not installed")
    exe = tmp_path / name
    cmd = [cc, "-std=c11", "-pthread", *flags, f"-I{COMMON}", f"-I{ROOT / 'simd' / 'include'}",
           str(Path(__file__).parent / "check_threads.c"), *map(str, SOURCES), "-o", str(exe),
           "-lm"]  # fmt: skip
    built = subprocess.run(cmd, capture_output=True, text=True)
    if built.returncode and "tsan" in built.stderr:
        missing_tool(f"gcc cannot link ThreadSanitizer: {built.stderr.strip()[-300:]}")
    assert built.returncode == 0, built.stderr
    return exe


@pytest.mark.parametrize("sanitizer", [None, "thread"])
def test_pool_and_step_threads(tmp_path, sanitizer):
    flags = ["-O2"] if sanitizer is None else ["-O1", "-g", f"-fsanitize={sanitizer}"]
    exe = _build(tmp_path, f"check_threads_{sanitizer or 'plain'}", flags)
    run = subprocess.run(
        [str(exe)], capture_output=True, text=True, timeout=600,
        env={"TSAN_OPTIONS": "halt_on_error=1 exitcode=66"},
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert " 0 failed" in out and "WARNING: ThreadSanitizer" not in out, out[-4000:]
