"""The committed SPIR-V (simd/gpu_vulkan/shaders.c) is what the shaders compile to: the
sources' hash always, and word for word with the recorded glslc (Debian's, which CI
installs); in CI glslc must be there. A build of the package itself needs no glslc."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "simd" / "gpu_vulkan" / "generate_shaders.py"


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", *args],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def test_committed_spirv_matches_the_shaders():
    if shutil.which("glslc") is None and os.environ.get("CI"):
        pytest.fail("CI must have glslc (Debian's glslc package) to check the committed SPIR-V")
    done = _check()
    assert done.returncode == 0, done.stdout + done.stderr
    if shutil.which("glslc"):
        assert "matches the shaders" in done.stdout or "not the recorded glslc" in done.stdout


def test_a_changed_shader_is_caught(tmp_path):
    """A copy of the backend folder with one shader edited: --check fails and says to rerun."""
    copy = tmp_path / "gpu_vulkan"
    shutil.copytree(SCRIPT.parent, copy)
    comp = copy / "shaders" / "gemm.comp"
    comp.write_text(comp.read_text().replace("#define TOKENS 8u", "#define TOKENS 4u"))
    done = subprocess.run(
        [sys.executable, str(copy / SCRIPT.name), "--check", "--glslc", "/nonexistent/glslc"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "stale" in done.stdout and SCRIPT.name in done.stdout
